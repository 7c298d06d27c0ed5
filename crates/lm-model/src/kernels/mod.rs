//! The kernels: every SIMD routine of the crate, and the one way to reach
//! them, a [`dispatch::Dispatch`] (a CPU feature check done once). This is
//! the only module where `unsafe` code is allowed; every function that is
//! sound only on a CPU with some instruction set is an `unsafe fn` (or a
//! method of a trait whose methods are), and the safe functions that call
//! them take a `Dispatch`.
//!
//! - `activation`: activations quantized to 8-bit blocks in vectors.
//! - `dispatch`: which instruction sets this CPU runs, and `LM_KERNEL`'s choice.
//! - `dot`: products of GGML weight blocks with quantized activations: the
//!   entry (`dot/mod.rs`), the frame every SIMD kernel runs in
//!   (`dot/frame.rs`), the portable reference (`dot/portable*.rs`) and one
//!   file per instruction set and block family (`dot/avx2*.rs`,
//!   `dot/avx512*.rs`). The blocks' layouts and their scalar decoding are
//!   in `quant/block.rs` and `quant/block_k.rs`.
//! - `attention`: attention's products, weighted sums and f16 rounding,
//!   portable and per instruction set (`attention/x86.rs` their shared frame).
//! - `panel`: products of weights packed in panels of 16 rows
//!   (`quant/packed.rs`), a lane per row: portable, AVX2 (and AVX-VNNI)
//!   and AVX-512.
//! - `exp`: a vectorised `exp` with libm's bits, in AVX2 or AVX-512.
//! - `f16`: f16 rows widened to f32 and f32 values rounded to f16 (F16C).
//! - `read`: a plain read of memory with the kernels' loads and prefetches,
//!   the bench's read bound.
#![allow(unsafe_code)]

pub(crate) mod activation;
pub(crate) mod attention;
pub(crate) mod dispatch;
pub(crate) mod dot;
pub(crate) mod exp;
pub(crate) mod f16;
pub(crate) mod panel;
pub(crate) mod read;
