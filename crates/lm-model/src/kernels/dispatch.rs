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

use lm_core::cpu::CpuFeatures;

use crate::quant::QuantError;

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

/// The environment variable that asks for weights packed in panels when a
/// model loads (`LM_PACK=1`; `quant/packed.rs`): prefill of a 1B model 2-3x
/// faster and decode as fast or faster, at the price of llama.cpp's
/// arithmetic order. Panel products agree with the row-major ones to 1e-5
/// of their magnitude, but each layer's 8-bit activations amplify any
/// change of order, and on SmolLM2's chat row (the conformance suite's most
/// sensitive) one logit of the Q2_K and Q5_K_M mixes then lands farther
/// from exact than llama.cpp under any of sixteen settings that change only
/// its rounding (1.80 against at most 1.39, 1.95 against 1.66;
/// fixtures/smollm2-requant/README.md), though over all the prompt's rows the
/// two orders are about as far from exact; hence opt-in.
pub const PACK_ENV: &str = "LM_PACK";

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

    /// Whether weights are packed in panels when a model loads: asked for
    /// by [`PACK_ENV`] and a panel kernel here.
    pub fn packs_at_load(self) -> bool {
        self.has_panel_kernel() && std::env::var_os(PACK_ENV).is_some_and(|v| v == "1")
    }

    /// Whether products with weights packed in panels have a SIMD kernel
    /// here (else they run the portable one, for correctness only).
    pub fn has_panel_kernel(self) -> bool {
        matches!(self.kernel, Kernel::Avx2 | Kernel::AvxVnni | Kernel::Avx512)
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
