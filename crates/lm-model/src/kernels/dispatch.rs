//! Which SIMD paths a model runs, decided once per model from the CPU
//! features `lm_core::cpu` detected: the [`Kernel`] of the quantized dot
//! products and the F16C widening of the f16 KV cache.
//!
//! A [`Dispatch`] is the only way to reach the `unsafe` SIMD functions: it is
//! built only for features the CPU has, and the kernels and the cache take it
//! instead of detecting on their own.
//!
//! The environment variable `LM_KERNEL` (a [`Kernel::name`]) overrides the
//! choice for the whole process, so tests and benches can force each path on
//! one machine: [`Kernel::from_env`] reads it (front ends call it first and
//! refuse a bad value); a model built with a bad value logs a warning and
//! keeps the fastest kernel, so a name the CPU cannot run never reaches it.

use std::sync::OnceLock;

use lm_core::cpu::{CpuFeatures, CpuMaker};

use crate::quant::{GgmlType, QuantError};

/// Which implementation of the quantized dot products to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kernel {
    /// Plain Rust, for every target; the reference for the SIMD paths.
    Portable,
    /// x86_64 AVX2 + FMA + F16C intrinsics (Haswell and later).
    Avx2,
    /// The AVX2 kernels with the 256-bit VNNI dot instruction of AVX-VNNI
    /// (`vpdpbusd`, four byte products per i32 lane in one instruction) where
    /// they multiply bytes: for CPUs with AVX-VNNI and no AVX-512 (Alder Lake
    /// and later).
    AvxVnni,
    /// AVX-512 F/BW/VL with AVX512-VNNI: two 32-weight blocks (or two
    /// 32-value chunks of a super-block) per 512-bit vector, `vpdpbusd` for
    /// the byte products.
    Avx512,
}

/// The environment variable that overrides the kernel choice.
pub const KERNEL_ENV: &str = "LM_KERNEL";

/// The environment variable that says which weights are packed in panels
/// when a model loads ([`Packing`]): `0` none, `1` the 32-weight types,
/// `all` (or unset) the K-quants too.
pub const PACK_ENV: &str = "LM_PACK";

/// Which weight matrices are packed in panels when a model loads
/// (`quant/packed.rs`), where the kernel path has panel products (AVX2,
/// AVX-VNNI, AVX-512); the rest stay row-major.
///
/// Panel sums run in another order than the row-major kernels' (which
/// follow llama.cpp's AVX2 kernels), so a packed model's logits move within
/// quantization noise (fixtures/smollm2-requant/README.md has the
/// conformance distances of both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// `LM_PACK=0`, or a path without panel kernels: every matrix row-major.
    RowMajor,
    /// `LM_PACK=1`: the 32-weight types Q4_0, Q4_1, Q5_0 and Q8_0 only
    /// (Q5_0 where the AVX-512 kernel runs: [`Kernel::packs`]), whose panels
    /// are faster than the row-major kernels in prefill and in decode (a 1B
    /// Q4_0 or Q8_0 model on Zen 4: prefill 2.0-3.3x and decode 1.2-1.8x
    /// llama.cpp's; SmolLM2's Q5_0 and Q4_1 files prefill 2-3x faster than
    /// row-major; docs/performance.md).
    Blocks,
    /// The default (`LM_PACK=all`): Q4_K and Q6_K as well, where their
    /// AVX-512 kernel runs: on the Xeon a 1B Q4_K_M prefills 1.6-1.75x
    /// llama.cpp's speed and decodes 1.7-1.8x at one thread
    /// (docs/performance.md).
    All,
}

impl Packing {
    /// The packing `LM_PACK`'s value names: `0`, `1` or `all`.
    pub fn from_name(name: &str) -> Result<Packing, QuantError> {
        match name.trim() {
            "0" => Ok(Packing::RowMajor),
            "1" => Ok(Packing::Blocks),
            "all" => Ok(Packing::All),
            _ => Err(QuantError::UnknownPacking {
                name: name.to_owned(),
            }),
        }
    }

    /// The packing [`PACK_ENV`] asks for; `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Packing>, QuantError> {
        match std::env::var_os(PACK_ENV) {
            Some(value) if !value.to_string_lossy().trim().is_empty() => {
                Packing::from_name(&value.to_string_lossy()).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Whether matrices of `ty` are packed under this policy (when their
    /// shape and kernel path allow: [`Kernel::packs`]).
    pub fn includes(self, ty: GgmlType) -> bool {
        match self {
            Packing::RowMajor => false,
            Packing::Blocks => matches!(
                ty,
                GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0
            ),
            Packing::All => true,
        }
    }
}

impl Kernel {
    /// Every kernel, slowest first: detection picks the last one the CPU runs.
    pub const ALL: [Kernel; 4] = [
        Kernel::Portable,
        Kernel::Avx2,
        Kernel::AvxVnni,
        Kernel::Avx512,
    ];

    /// The fastest kernel this CPU supports (whatever `LM_KERNEL` says).
    pub fn detect() -> Kernel {
        fastest(CpuFeatures::detect())
    }

    /// The kernel models built in this process use: `LM_KERNEL`'s when it
    /// names one this CPU runs, otherwise the fastest.
    pub fn configured() -> Kernel {
        Dispatch::detect().kernel
    }

    /// Whether products with weights packed in panels have a SIMD kernel on
    /// this path (else they would run the portable one, for correctness
    /// only).
    pub fn has_panel_kernel(self) -> bool {
        matches!(self, Kernel::Avx2 | Kernel::AvxVnni | Kernel::Avx512)
    }

    /// Which weights are packed in panels when a model loads on this path:
    /// [`PACK_ENV`]'s choice where the path has panel kernels (an unknown
    /// value is warned about and gives the default).
    pub fn packing(self) -> Packing {
        if !self.has_panel_kernel() {
            return Packing::RowMajor;
        }
        Packing::from_env()
            .unwrap_or_else(|e| {
                log::warn!("{PACK_ENV}: {e}; packing every type with panel kernels");
                None
            })
            .unwrap_or(Packing::All)
    }

    /// Whether a model load on this path packs matrices of `ty` (those of
    /// whole panels): what [`Kernel::packing`] includes of the types whose
    /// panels pay here. Q4_0, Q4_1 and Q8_0 wherever there are panel
    /// kernels; Q5_0, Q4_K and Q6_K on AVX-512 only: on AVX2 the K-quant
    /// panels decode slower than row-major (docs/performance.md), and Q5_0
    /// in panels beside row-major K-quants parted two of SmolLM2's
    /// conformance cases from llama.cpp at near-ties
    /// (fixtures/smollm2-requant/README.md).
    pub fn packs(self, ty: GgmlType) -> bool {
        self.packs_under(self.packing(), ty)
    }

    /// [`Kernel::packs`] under `packing` rather than [`PACK_ENV`]'s.
    pub fn packs_under(self, packing: Packing, ty: GgmlType) -> bool {
        let pays_here = match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => self.has_panel_kernel(),
            GgmlType::Q5_0 | GgmlType::Q4_K | GgmlType::Q6_K => self == Kernel::Avx512,
            _ => false,
        };
        pays_here && packing.includes(ty)
    }

    /// Whether any weights are packed in panels when a model loads on
    /// this path ([`Kernel::packing`]).
    pub fn packs_at_load(self) -> bool {
        self.packing() != Packing::RowMajor
    }

    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        self.runs_on(CpuFeatures::detect())
    }

    /// The kernels this CPU runs, slowest first (the portable one always).
    pub fn available() -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    /// The kernel's name, as `LM_KERNEL` takes it: `portable`, `avx2`,
    /// `avxvnni` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::AvxVnni => "avxvnni",
            Kernel::Avx512 => "avx512",
        }
    }

    /// The kernel called `name` (see [`Kernel::name`]; ASCII case ignored).
    ///
    /// ```
    /// use lm_model::{Kernel, QuantError};
    /// assert_eq!(Kernel::from_name("AVX2"), Ok(Kernel::Avx2));
    /// assert!(matches!(Kernel::from_name("sse9"), Err(QuantError::UnknownKernel { .. })));
    /// ```
    pub fn from_name(name: &str) -> Result<Kernel, QuantError> {
        Kernel::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(name.trim()))
            .ok_or_else(|| QuantError::UnknownKernel {
                name: name.to_owned(),
            })
    }

    /// The kernel `LM_KERNEL` asks for: `None` when it is unset or empty, an
    /// error when it names no kernel or one this CPU cannot run.
    pub fn from_env() -> Result<Option<Kernel>, QuantError> {
        let Some(value) = std::env::var_os(KERNEL_ENV) else {
            return Ok(None);
        };
        let value = value.to_string_lossy();
        if value.trim().is_empty() {
            return Ok(None);
        }
        let kernel = Kernel::from_name(&value)?;
        if kernel.is_available() {
            Ok(Some(kernel))
        } else {
            Err(QuantError::KernelUnavailable { kernel })
        }
    }

    fn runs_on(self, f: CpuFeatures) -> bool {
        let x86 = cfg!(target_arch = "x86_64");
        let avx2 = x86 && f.avx2 && f.fma && f.f16c;
        match self {
            Kernel::Portable => true,
            Kernel::Avx2 => avx2,
            Kernel::AvxVnni => avx2 && f.avxvnni,
            Kernel::Avx512 => avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni,
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The fastest kernel `features` run.
fn fastest(features: CpuFeatures) -> Kernel {
    Kernel::ALL
        .into_iter()
        .rev()
        .find(|k| k.runs_on(features))
        .unwrap_or(Kernel::Portable)
}

/// A kernel and CPU features whose availability has been checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dispatch {
    kernel: Kernel,
    /// Features this token may use; a subset of the detected ones.
    features: CpuFeatures,
}

impl Dispatch {
    /// Portable code only, available everywhere.
    pub const PORTABLE: Dispatch = Dispatch {
        kernel: Kernel::Portable,
        features: CpuFeatures::NONE,
    };

    /// The paths this process uses: the kernel `LM_KERNEL` names, or the
    /// fastest this CPU supports (with a logged warning when `LM_KERNEL`
    /// names no kernel or one the CPU lacks). Decided on the first call.
    pub fn detect() -> Dispatch {
        static CONFIGURED: OnceLock<Dispatch> = OnceLock::new();
        *CONFIGURED.get_or_init(|| {
            let features = CpuFeatures::detect();
            let kernel = Kernel::from_env().unwrap_or_else(|e| {
                log::warn!("{KERNEL_ENV}: {e}; using the fastest kernel");
                None
            });
            Dispatch {
                kernel: kernel.unwrap_or_else(|| fastest(features)),
                features,
            }
        })
    }

    /// `Some` if the CPU supports `kernel`; the other paths stay the fastest
    /// available.
    pub fn new(kernel: Kernel) -> Option<Dispatch> {
        let features = CpuFeatures::detect();
        kernel
            .runs_on(features)
            .then_some(Dispatch { kernel, features })
    }

    /// A dispatch for every kernel this CPU runs, slowest first: the tests
    /// run each path.
    #[cfg(test)]
    pub fn every_available() -> Vec<Dispatch> {
        Kernel::available()
            .into_iter()
            .filter_map(Dispatch::new)
            .collect()
    }

    /// The dot-product kernel.
    pub fn kernel(self) -> Kernel {
        self.kernel
    }

    /// Whether weights are packed in panels when a model loads
    /// ([`Kernel::packs_at_load`]).
    pub fn packs_at_load(self) -> bool {
        self.kernel.packs_at_load()
    }

    /// Who made the CPU.
    pub fn maker(self) -> CpuMaker {
        self.features.maker
    }

    /// Whether f16 values can be widened with AVX + F16C.
    pub fn has_f16c(self) -> bool {
        cfg!(target_arch = "x86_64") && self.features.avx && self.features.f16c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packings_are_named_as_lm_pack_takes_them() {
        assert_eq!(Packing::from_name("0").unwrap(), Packing::RowMajor);
        assert_eq!(Packing::from_name("1").unwrap(), Packing::Blocks);
        assert_eq!(Packing::from_name(" all ").unwrap(), Packing::All);
        let err = Packing::from_name("yes").unwrap_err().to_string();
        assert!(
            err.contains("\"yes\"") && err.contains("0 (row-major)"),
            "{err}"
        );
        assert!(!Packing::RowMajor.includes(GgmlType::Q4_0));
        assert!(Packing::Blocks.includes(GgmlType::Q8_0));
        assert!(Packing::Blocks.includes(GgmlType::Q5_0));
        assert!(Packing::Blocks.includes(GgmlType::Q4_1));
        assert!(Packing::All.includes(GgmlType::Q4_1));
        assert!(!Packing::Blocks.includes(GgmlType::Q5_1));
        assert!(!Packing::Blocks.includes(GgmlType::Q4_K));
        assert!(Packing::All.includes(GgmlType::Q6_K));
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_errors() {
        for kernel in Kernel::ALL {
            assert_eq!(Kernel::from_name(kernel.name()), Ok(kernel));
            assert_eq!(kernel.to_string(), kernel.name());
        }
        assert_eq!(
            Kernel::from_name("avx1024"),
            Err(QuantError::UnknownKernel {
                name: "avx1024".into()
            })
        );
    }

    #[test]
    fn each_kernel_needs_its_features() {
        // `CpuFeatures` is non-exhaustive: built by setting fields.
        let mut avx2 = CpuFeatures::NONE;
        (avx2.avx, avx2.avx2, avx2.fma, avx2.f16c) = (true, true, true, true);
        let mut vnni = avx2;
        vnni.avxvnni = true;
        let mut avx512 = avx2;
        (avx512.avx512f, avx512.avx512bw) = (true, true);
        (avx512.avx512vl, avx512.avx512vnni) = (true, true);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(fastest(CpuFeatures::NONE), Kernel::Portable);
            assert_eq!(fastest(avx2), Kernel::Avx2);
            assert_eq!(fastest(vnni), Kernel::AvxVnni);
            assert_eq!(fastest(avx512), Kernel::Avx512);
            assert!(!Kernel::AvxVnni.runs_on(avx512));
            let mut no_vnni = avx512;
            no_vnni.avx512vnni = false;
            assert_eq!(fastest(no_vnni), Kernel::Avx2);
        } else {
            assert_eq!(fastest(avx512), Kernel::Portable);
        }
        assert_eq!(Kernel::available().first(), Some(&Kernel::Portable));
        assert!(Kernel::available().contains(&Kernel::detect()));
    }
}
