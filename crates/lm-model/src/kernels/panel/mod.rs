//! Products of weights packed in panels of 16 rows
//! ([`crate::quant::packed`]) with activations quantized to 32-value
//! blocks: the portable reference, the AVX2 kernel (with AVX-VNNI's
//! `vpdpbusd` where the CPU has it) and the AVX-512 VNNI kernel, with the
//! same bits (the arithmetic is stated in `quant/packed.rs`).
//!
//! A product tiles its inputs by up to [`MAX_TILE`] (four on AVX2): each block of a panel
//! is unpacked once per tile, into vectors whose lanes are the panel's rows,
//! and every input of the tile multiplies the same vectors, so unpacking
//! costs a fraction of the products and the f32 work is one conversion and
//! one fused multiply-add per block for sixteen rows.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};

use lm_core::cpu::CpuMaker;

use crate::kernels::dispatch::{Dispatch, Kernel};
use crate::quant::GgmlType;
use crate::quant::activation::{Q8Block, Q8KBlock};
#[cfg(target_arch = "x86_64")]
use crate::quant::packed::quants_at;
use crate::quant::packed::{PANEL_ROWS, unpack_block};

/// `$name::<U>(quants, k)`: vector `k` (0..8) of a half or whole panel's
/// block of `U` as unsigned bytes `u = q + OFFSET`, four weights per lane,
/// meeting input bytes `4k..4k + 4`, from the block's chunks at `quants`,
/// on one SIMD width (`$v`, its load, and, or, 16-bit shifts, xor). The
/// nibble types' four chunks hold the low nibbles, weights 0..16, and the
/// high ones, 16..32: chunk `c`'s low nibbles are vector `c`, its high ones
/// `4 + c`. Q5_0 adds the fifth bits, from its `qh` lanes just before the
/// chunks, stored so that one shift puts vector `k`'s at bit 4 of each byte
/// (`quant/packed.rs`, `spread_high_bits`): `u = nibble | 16 · bit`. Q8_0's
/// eight chunks hold signed bytes, made unsigned by flipping the sign bit
/// (`q + 128`). The AVX2 and AVX-512 kernels read all so.
#[cfg(target_arch = "x86_64")]
macro_rules! unsigned_vector {
    (
        $name:ident, $v:ty, $load:ident, $and:ident, $or:ident,
        $slli:ident, $srli:ident, $xor:ident, $set1:ident
    ) => {
        /// See `unsigned_vector!` in `panel/mod.rs`.
        ///
        /// # Safety
        /// `quants` points at the chunks of a block as said (after Q5_0's
        /// `qh` lanes); the CPU has the vector width's instructions and the
        /// call is inlined into a function compiled with them.
        #[inline(always)]
        unsafe fn $name<U: super::Packed>(quants: *const u8, k: usize) -> $v {
            // SAFETY: the caller's contract: chunk `k % 4` (nibbles) or `k`
            // (Q8_0) is the block's, and Q5_0's `qh` lanes the chunk-sized
            // run before its first chunk.
            unsafe {
                if U::NIBBLES {
                    let chunk = $load(quants.add(k % 4 * CHUNK_BYTES).cast());
                    let nibbles = if k < 4 { chunk } else { $srli::<4>(chunk) };
                    let nibbles = $and(nibbles, $set1(0x0F));
                    if !U::HIGH_BIT {
                        return nibbles;
                    }
                    let stored = $load(quants.sub(CHUNK_BYTES).cast());
                    // Bit k of each byte to bit 4 (a bit never crosses into
                    // the 16-bit lane's other byte there).
                    let high = match k {
                        0 => $slli::<4>(stored),
                        1 => $slli::<3>(stored),
                        2 => $slli::<2>(stored),
                        3 => $slli::<1>(stored),
                        4 => stored,
                        5 => $srli::<1>(stored),
                        6 => $srli::<2>(stored),
                        _ => $srli::<3>(stored),
                    };
                    $or(nibbles, $and(high, $set1(0x10)))
                } else {
                    let chunk = $load(quants.add(k * CHUNK_BYTES).cast());
                    $xor(chunk, $set1(0x80u8 as i8))
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_k;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_k;
mod portable;
mod portable_k;

/// One panel product's operands: the panels (each `n_blocks` blocks of a
/// packed type) and `n` inputs, input `i` being `xq[i * n_blocks..][..n_blocks]`.
#[derive(Clone, Copy)]
pub(crate) struct PanelProduct<'a, A> {
    /// Whole panels.
    pub panels: &'a [u8],
    /// Blocks per row (and per input).
    pub n_blocks: usize,
    /// The inputs' activation blocks.
    pub xq: &'a [A],
    /// Each input block's `Σ qs` (32-weight types; empty for Q8_K blocks,
    /// which hold their sums).
    pub sums: &'a [i32],
    /// How many inputs.
    pub n: usize,
    /// How far apart the lines are that passes with one or two inputs ask
    /// for ahead of the block they multiply: [`LINE_BYTES`], or 0 for none
    /// ([`Dispatch::prefetches_panels`]; [`prefetch_lines`]; the K-quant
    /// kernels on AVX-512 ask for every line where they first load it,
    /// [`prefetch_ahead`]).
    pub prefetch_stride: usize,
}

impl<'a, A> PanelProduct<'a, A> {
    /// The loop of the portable kernels, a row and an input at a time:
    /// `out[(p * n + i) * 16 + r]` is `step` folded over the blocks `b` in
    /// order from 0.0, `acc = step(acc, block, x)`, where `block` is block
    /// `b` of row `r` of panel `p` of `ty` put back in GGUF's layout and `x`
    /// input `i`'s block `b`.
    pub(crate) fn fold_blocks(
        self,
        ty: GgmlType,
        out: &mut [f32],
        mut step: impl FnMut(f32, &[u8], &A) -> f32,
    ) {
        let row_bytes = self.n_blocks * ty.block_bytes();
        let mut block = vec![0u8; ty.block_bytes()];
        for (panel, out) in self
            .panels
            .chunks_exact(PANEL_ROWS * row_bytes)
            .zip(out.chunks_exact_mut(self.n * PANEL_ROWS))
        {
            for (x, out) in self
                .xq
                .chunks_exact(self.n_blocks)
                .zip(out.chunks_exact_mut(PANEL_ROWS))
            {
                for (r, o) in out.iter_mut().enumerate() {
                    *o = x.iter().enumerate().fold(0.0, |acc, (b, x)| {
                        unpack_block(ty, panel, row_bytes, r, b, &mut block);
                        step(acc, &block, x)
                    });
                }
            }
        }
    }

    /// Checks (in debug builds) that the panels are whole panels of `ty`,
    /// `out` holds a result per row and input, `xq` `n` inputs and `sums`
    /// none (Q8_K inputs) or one per block.
    fn debug_check(&self, ty: GgmlType, out: &[f32]) {
        let panel_bytes = PANEL_ROWS * self.n_blocks * ty.block_bytes();
        debug_assert!(panel_bytes > 0 && self.panels.len().is_multiple_of(panel_bytes));
        debug_assert_eq!(
            out.len(),
            self.panels.len() / panel_bytes * self.n * PANEL_ROWS
        );
        debug_assert_eq!(self.xq.len(), self.n * self.n_blocks);
        debug_assert!(self.sums.is_empty() || self.sums.len() == self.xq.len());
    }

    /// Calls `tile(panel, part, out)` for each panel (`panel_bytes` long)
    /// and each of the fewest balanced tiles of at most `max_tile` inputs
    /// (sizes `floor((n + k) / n_tiles)`, which sum to `n` and differ by at
    /// most one, so no input is multiplied alone when `n > 1`): `part` is
    /// the tile's inputs (its `n` the tile's size) and `out` its results,
    /// `part.n * 16` values. The loop every panel kernel runs.
    #[inline(always)]
    pub(crate) fn each_tile(
        self,
        panel_bytes: usize,
        max_tile: usize,
        out: &mut [f32],
        mut tile: impl FnMut(&'a [u8], PanelProduct<'a, A>, &mut [f32]),
    ) {
        let PanelProduct {
            panels,
            n_blocks,
            xq,
            sums,
            n,
            prefetch_stride,
        } = self;
        let n_tiles = n.div_ceil(max_tile);
        for (panel, out) in panels
            .chunks_exact(panel_bytes)
            .zip(out.chunks_exact_mut(n * PANEL_ROWS))
        {
            let mut start = 0;
            for k in 0..n_tiles {
                let size = (n + k) / n_tiles;
                let inputs = start * n_blocks..(start + size) * n_blocks;
                let part = PanelProduct {
                    panels: panel,
                    n_blocks,
                    xq: &xq[inputs.clone()],
                    sums: sums.get(inputs).unwrap_or(&[]),
                    n: size,
                    prefetch_stride,
                };
                tile(
                    panel,
                    part,
                    &mut out[start * PANEL_ROWS..][..size * PANEL_ROWS],
                );
                start += size;
            }
        }
    }
}

/// A packed 32-weight type as the SIMD kernels read its panels: a block's
/// record is `| 16 scales | Q4_1's 16 minimums or Q5_0's qh lanes | chunks |`
/// (`quant/packed.rs`).
#[cfg(target_arch = "x86_64")]
trait Packed {
    /// The type.
    const TY: GgmlType;
    /// Bytes of a panel's block: sixteen rows' blocks.
    const RECORD_BYTES: usize;
    /// Where a record's chunks of quant bytes start.
    const QUANTS_AT: usize = quants_at(Self::TY);
    /// What the unsigned bytes the kernels multiply exceed the weights by.
    const OFFSET: i32 = match Self::TY {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q8_0 => 128,
        _ => 0,
    };
    /// Whether the chunks hold nibbles (Q4_0, Q4_1, Q5_0), else signed
    /// bytes (Q8_0).
    const NIBBLES: bool = !matches!(Self::TY, GgmlType::Q8_0);
    /// Whether the record holds minimums after the scales (Q4_1).
    const MINS: bool = matches!(Self::TY, GgmlType::Q4_1);
    /// Whether the record holds the weights' fifth bits (Q5_0).
    const HIGH_BIT: bool = matches!(Self::TY, GgmlType::Q5_0);
}

/// A unit type per packed 32-weight type, named as the type.
#[cfg(target_arch = "x86_64")]
macro_rules! packed_types {
    ($($ty:ident: $block_bytes:literal),*) => {$(
        #[doc = concat!(stringify!($ty), " in panels.")]
        #[allow(non_camel_case_types)]
        struct $ty;

        impl Packed for $ty {
            const TY: GgmlType = GgmlType::$ty;
            const RECORD_BYTES: usize = PANEL_ROWS * $block_bytes;
        }
    )*};
}

#[cfg(target_arch = "x86_64")]
packed_types!(Q4_0: 18, Q4_1: 20, Q5_0: 22, Q8_0: 34);

/// The most inputs that share one unpacking of a panel's block: eight
/// inputs' accumulators and the block's eight vectors of weights fit
/// AVX-512's 32 registers with room for the scales.
pub(crate) const MAX_TILE: usize = 8;

/// How far ahead of the block being multiplied the AVX2 kernels ask for
/// their panel's lines, into L1. A panel is one stream through memory,
/// which the hardware prefetcher follows less far ahead than the sixteen
/// streams of sixteen row-major rows; 2 and 4 KB did equally well (Zen 4
/// and Xeon). The AVX-512 kernels ask two levels ahead
/// ([`prefetch_ahead`]).
pub(crate) const PREFETCH_BYTES: usize = 2048;

/// A cache line, the step of a pass that prefetches every line.
pub(crate) const LINE_BYTES: usize = 64;

/// Calls `ask` for the lines of the `bytes` bytes at `at`, `stride` bytes
/// apart (none when `stride` is 0): [`prefetch_line`] on AVX2, two levels
/// ahead ([`prefetch_ahead`]) on AVX-512, whose 32-weight records are 5 to
/// 9 lines. The pointer is never dereferenced.
///
/// The stride is read at run time, so the compiler keeps this a loop of
/// one line per iteration: unrolled into a burst of a record's 36, the
/// same prefetches ran 1B Q4_K_M decode 12% slower on the Xeon (18.3
/// against 20.8 tok/s at one thread, interleaved pairs), and spread over
/// the record's loads ([`prefetch_ahead`]) 2-5% faster. On AVX-512, the
/// Q4_0 panels of 1B's ffn_up streamed 8% faster with two levels than with
/// one request per line 2 KB ahead, Q8_0's 3% (Xeon, one thread,
/// `benches/quant`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_lines(at: *const u8, bytes: usize, stride: usize, ask: impl Fn(*const u8)) {
    if stride == 0 {
        return;
    }
    let mut offset = 0;
    while offset < bytes {
        ask(at.wrapping_add(offset));
        offset += stride;
    }
}

/// Asks for the line at `at` into every cache level. A prefetch does not
/// fault, whatever the address.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_line(at: *const u8) {
    // SAFETY: prefetching needs only SSE, which every x86-64 CPU has.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) };
}

/// How far ahead of the byte it loads [`prefetch_ahead`] asks for a line
/// into the first-level cache, and into the second: two levels, so that a
/// line is mostly in L2 when it is asked for into L1, and the L1 request
/// holds one of the core's few fill buffers only for an L2 hit's time.
/// With the one request 2 KB ahead into L1, the Q4_K panels of 1B's ffn_up
/// streamed 12.8-13.5 GiB/s at one thread on the Xeon; with 1 KB into L1
/// and 4 KB into L2, 14.4-14.9 (`benches/quant`, 1 GiB in 2 MB pages; the
/// L2 request alone, 13.1). Two threads, each a core's share of the
/// memory's bandwidth, wait longer for a line: there 3 KB and 16 KB ran
/// 1B decode faster than 1 KB and 4 KB (Xeon, interleaved rounds of
/// `lm-cli`: Q4_0 1.08x at two threads and 1.02x at one, Q8_0 1.03x at
/// both; 2/12, 2/16 and 1/12 KB within 3% of it), and Q6_K, which asked
/// 2 KB ahead into L1 alone, ran Q4_K_M 1.03x faster at one thread with
/// them.
const AHEAD_L1_BYTES: usize = 3072;
const AHEAD_L2_BYTES: usize = 16384;

/// Asks for the line [`AHEAD_L1_BYTES`] past `at` into L1 and the one
/// [`AHEAD_L2_BYTES`] past it into L2, in place among the loads (see
/// [`prefetch_in_place`]): a kernel that calls it beside each first load
/// of a line spreads its prefetches over its work.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead(at: *const u8) {
    prefetch_in_place::<true>(at.wrapping_add(AHEAD_L1_BYTES));
    prefetch_in_place::<false>(at.wrapping_add(AHEAD_L2_BYTES));
}

/// Asks for the line at `line` into L1 (`prefetcht0`) or, if not
/// `INTO_L1`, into L2 (`prefetcht1`), at this point among the loads around
/// it.
///
/// An `asm!` block rather than `_mm_prefetch`, which the compiler is free
/// to move: it gathered the AVX-512 K-quant kernel's per-piece prefetches
/// into bursts of 16, and that kernel ran 1B Q4_K_M decode slower than
/// with one burst per record. Kept in place, one-thread decode ran 2-5%
/// faster than the burst per record (Xeon, interleaved pairs).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_in_place<const INTO_L1: bool>(line: *const u8) {
    // SAFETY: a prefetch does not fault, whatever the address, and needs
    // only SSE, which every x86-64 CPU has. The blocks read and write no
    // memory; they are not marked `nomem` only so that the compiler keeps
    // them in order with the loads beside them.
    unsafe {
        if INTO_L1 {
            std::arch::asm!("prefetcht0 [{}]", in(reg) line, options(nostack, preserves_flags));
        } else {
            std::arch::asm!("prefetcht1 [{}]", in(reg) line, options(nostack, preserves_flags));
        }
    }
}

/// A panel product's kernel: sound only on a CPU with its instruction
/// sets, which a [`Dispatch`] checked when it chose it.
pub(crate) type PanelKernel<A> = unsafe fn(GgmlType, PanelProduct<'_, A>, &mut [f32]);

/// The activation blocks a panel product takes: each kind has its kernels.
pub(crate) trait PanelInput: Sized {
    /// The product for this kind of input on `kernel`.
    fn kernel(kernel: Kernel) -> PanelKernel<Self>;
}

/// Q4_0, Q4_1, Q5_0 and Q8_0 panels ([`crate::quant::packed`]) with Q8_0
/// inputs and their blocks' sums of quantized values (`Σ qs`, indexed as
/// `xq`).
impl PanelInput for Q8Block {
    fn kernel(kernel: Kernel) -> PanelKernel<Self> {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => avx512::dot_panels,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => avx2::dot_panels,
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => avx2::dot_panels_vnni,
            _ => portable::dot_panels,
        }
    }
}

/// Q4_K and Q6_K panels ([`crate::quant::packed_k`]) with Q8_K inputs
/// (their sums are in the blocks).
impl PanelInput for Q8KBlock {
    fn kernel(kernel: Kernel) -> PanelKernel<Self> {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => avx512_k::dot_panels_k,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => avx2_k::dot_panels_k,
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => avx2_k::dot_panels_k_vnni,
            _ => portable_k::dot_panels_k,
        }
    }
}

impl Dispatch {
    /// Whether passes with one or two inputs (decode) over `ty`'s panels
    /// prefetch them ([`prefetch_lines`], [`prefetch_ahead`]), as measured
    /// per kernel and maker; a prefetch never changes a result.
    /// - AVX-512 on Intel: every type. On a Xeon (AVX-512 VNNI, idle,
    ///   2026-12-06) one-thread decode of the 1B shape ran 1.47x faster in
    ///   Q4_0, 1.29x in Q4_K_M and 1.11x in Q8_0 than with Zen 4's choice
    ///   (interleaved pairs, `lm-cli`; docs/performance.md).
    /// - AVX-512 elsewhere: Q4_1, Q5_0 and Q8_0, whose streams the Zen 4's
    ///   prefetcher alone left at a third of the read bandwidth (Q8_0's
    ///   loads stalled on memory; `perf annotate`). Not Q4_0, whose 1B and
    ///   3B decode at one thread ran 10-18% faster without (10 of 10
    ///   interleaved pairs, loaded Zen 4); not the K-quants, whose first
    ///   kernel ran 1B Q4_K_M decode at 18-20 tok/s with it, 29-38 without.
    ///   Both were measured with the prefetches unrolled into bursts, which
    ///   cost the Xeon 12% ([`prefetch_lines`]); Zen 4 is yet to be
    ///   measured with the loop.
    /// - AVX2 and AVX-VNNI: the 32-weight types (1B Q8_0 decode 0.8x
    ///   row-major's speed without, 0.93x with; Zen 4, `LM_KERNEL=avx2`);
    ///   their K-quant kernels do not prefetch.
    pub(crate) fn prefetches_panels(self, ty: GgmlType) -> bool {
        let k_quant = matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K);
        match self.kernel() {
            Kernel::Avx512 if self.maker() == CpuMaker::Intel => true,
            Kernel::Avx512 => !k_quant && ty != GgmlType::Q4_0,
            Kernel::Avx2 | Kernel::AvxVnni => !k_quant,
            Kernel::Portable => false,
        }
    }

    /// `out[(p * n + i) * 16 + l] = row (16 p + l) · input i` for the panels
    /// of `panels` (each `n_blocks` blocks of `ty`) and `n` inputs, input
    /// `i` being `xq[i * n_blocks..][..n_blocks]` (and, for Q8_0 inputs,
    /// `sums` their blocks' sums of quantized values, `Σ qs`).
    ///
    /// Lengths are the caller's contract, checked in debug builds.
    pub(crate) fn dot_panels<A: PanelInput>(
        self,
        ty: GgmlType,
        product: PanelProduct<'_, A>,
        out: &mut [f32],
    ) {
        product.debug_check(ty, out);
        // SAFETY: a `Dispatch` holds a kernel only on a CPU with its
        // instruction sets (`Kernel::runs_on`): AVX-512 with avx512f/bw/vl/
        // vnni (and avx2, fma, f16c), AVX2 with avx2, fma and f16c, AVX-VNNI
        // with those and avxvnni.
        unsafe { A::kernel(self.kernel())(ty, product, out) }
    }
}

/// What the SIMD kernels' tests share: inputs and the bit-for-bit check.
#[cfg(all(test, target_arch = "x86_64"))]
mod simd_check {
    use lm_core::cpu::CpuFeatures;

    use super::{LINE_BYTES, PANEL_ROWS, PanelKernel, PanelProduct};
    use crate::kernels::dispatch::Kernel;
    use crate::quant::GgmlType;

    /// A pseudo-random generator (a 64-bit LCG's high bits).
    pub(super) fn lcg(seed: u64) -> impl FnMut() -> u32 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        }
    }

    /// A SIMD kernel by name, and whether this CPU has its instruction sets.
    pub(super) type Candidate<A> = (&'static str, bool, PanelKernel<A>);

    /// The SIMD kernels of one kind of input, each with whether this CPU
    /// runs it: AVX2, AVX-VNNI, AVX-VNNI's arithmetic in the EVEX encoding
    /// of AVX-512 VNNI (`avx2::tests::Avx512Vl`), and AVX-512.
    pub(super) fn candidates<A>(
        avx2: PanelKernel<A>,
        avxvnni: PanelKernel<A>,
        evex: PanelKernel<A>,
        avx512: PanelKernel<A>,
    ) -> [Candidate<A>; 4] {
        let f = CpuFeatures::detect();
        [
            ("avx2", Kernel::Avx2.is_available(), avx2),
            ("avxvnni", Kernel::AvxVnni.is_available(), avxvnni),
            (
                "vnni (evex)",
                Kernel::Avx2.is_available() && f.avx512vnni && f.avx512vl,
                evex,
            ),
            ("avx512", Kernel::Avx512.is_available(), avx512),
        ]
    }

    /// Multiplies `panels` (each `n_blocks` blocks of `ty`) by `inputs(n)`
    /// for every tile size `n` in `ns`, prefetching and not, and asserts
    /// that every candidate this CPU has gives the bits of `reference` (the
    /// portable kernel), which are finite and not zero.
    pub(super) fn assert_same_bits<A: Copy>(
        candidates: &[Candidate<A>],
        reference: PanelKernel<A>,
        (ty, panels, n_blocks): (GgmlType, &[u8], usize),
        ns: &[usize],
        inputs: impl Fn(usize) -> (Vec<A>, Vec<i32>),
        case: &str,
    ) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let n_panels = panels.len() / (n_blocks * PANEL_ROWS * ty.block_bytes());
        for &n in ns {
            let (xq, sums) = inputs(n);
            for prefetch_stride in [0, LINE_BYTES] {
                let product = PanelProduct {
                    panels,
                    n_blocks,
                    xq: &xq,
                    sums: &sums,
                    n,
                    prefetch_stride,
                };
                let case = format!("{ty}, {case}, n {n}, stride {prefetch_stride}");
                let mut expected = vec![0.0f32; n_panels * n * PANEL_ROWS];
                // SAFETY: the portable kernel runs on every CPU.
                unsafe { reference(ty, product, &mut expected) };
                assert!(
                    expected.iter().all(|v| v.is_finite() && *v != 0.0),
                    "{case}"
                );
                for &(name, available, kernel) in candidates {
                    if available {
                        let mut out = vec![0.0f32; expected.len()];
                        // SAFETY: `available` says the CPU has the kernel's
                        // instruction sets.
                        unsafe { kernel(ty, product, &mut out) };
                        assert_eq!(bits(&out), bits(&expected), "{name}: {case}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QMatrix;
    use crate::quant::packed::pack_in_place;

    /// Q4_1 and Q5_0 panels, packed directly (whatever `LM_PACK` says),
    /// multiply as their rows do on every kernel this CPU runs: the same
    /// bits on each kernel, each input of a batch its own product's bits,
    /// within 1e-5 of Σ|W x| of the row-major product.
    #[test]
    fn q4_1_and_q5_0_panels_multiply_as_their_rows() {
        for ty in [GgmlType::Q4_1, GgmlType::Q5_0] {
            let (n_rows, n_cols, n) = (32, 320, 11);
            let row_bytes = ty.row_bytes(n_cols).expect("whole blocks");
            let mut data: Vec<u8> = (0..n_rows * row_bytes)
                .map(|i| (i * 131 % 251) as u8)
                .collect();
            for block in data.chunks_exact_mut(ty.block_bytes()) {
                let d = 0.001 + f32::from(block[5]) * 1e-4;
                block[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
                if ty == GgmlType::Q4_1 {
                    let m = -f32::from(block[7]) * 1e-3;
                    block[2..4].copy_from_slice(&half::f16::from_f32(m).to_le_bytes());
                }
            }
            let mut packed = data.clone();
            pack_in_place(ty, &mut packed, row_bytes);
            let xs: Vec<f32> = (0..n * n_cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                .collect();
            let mut first: Option<Vec<f32>> = None;
            for dispatch in Dispatch::every_available() {
                let w = QMatrix::checked_before(ty, n_rows, n_cols, &data, dispatch);
                let p = QMatrix::checked_before(ty, n_rows, n_cols, &packed, dispatch).in_panels();
                let mut batch = vec![0.0; n * n_rows];
                p.matmul(&xs, n, &mut batch).expect("shapes");
                for (i, x) in xs.chunks_exact(n_cols).enumerate() {
                    let (mut one, mut rows) = (vec![0.0; n_rows], vec![0.0; n_rows]);
                    p.matvec(x, &mut one).expect("shapes");
                    w.matvec(x, &mut rows).expect("shapes");
                    assert_eq!(one, batch[i * n_rows..][..n_rows], "{ty} input {i}");
                    let mut dense = vec![0.0; n_cols];
                    for r in 0..n_rows {
                        w.dequantize_row(r, &mut dense).expect("row");
                        let magnitude: f32 = dense.iter().zip(x).map(|(w, x)| (w * x).abs()).sum();
                        let case = format!("{ty} {:?} row {r}", dispatch.kernel());
                        assert!((one[r] - rows[r]).abs() <= 1e-5 * magnitude, "{case}");
                    }
                }
                match &first {
                    None => first = Some(batch),
                    Some(first) => assert_eq!(&batch, first, "{ty} {:?}", dispatch.kernel()),
                }
            }
        }
    }
}
