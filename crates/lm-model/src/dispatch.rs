//! Which SIMD paths a model runs, decided once per model from the CPU
//! features `lm_core::cpu` detected: the [`Kernel`] of the quantized dot
//! products and the F16C widening of the f16 KV cache.
//!
//! A [`Dispatch`] is the only way to reach the `unsafe` SIMD functions: it is
//! built only for features the CPU has, and the kernels and the cache take it
//! instead of detecting on their own.

use lm_core::cpu::CpuFeatures;

/// Which implementation of the quantized dot products to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kernel {
    /// Plain Rust, for every target; the reference for the SIMD path.
    Portable,
    /// x86_64 AVX2 + FMA + F16C intrinsics (Haswell and later).
    Avx2,
}

impl Kernel {
    /// The fastest kernel this CPU supports.
    pub fn detect() -> Kernel {
        Dispatch::detect().kernel
    }

    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        self.runs_on(CpuFeatures::detect())
    }

    fn runs_on(self, features: CpuFeatures) -> bool {
        match self {
            Kernel::Portable => true,
            Kernel::Avx2 => {
                cfg!(target_arch = "x86_64") && features.avx2 && features.fma && features.f16c
            }
        }
    }
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

    /// The fastest paths this CPU supports.
    pub fn detect() -> Dispatch {
        let features = CpuFeatures::detect();
        let kernel = if Kernel::Avx2.runs_on(features) {
            Kernel::Avx2
        } else {
            Kernel::Portable
        };
        Dispatch { kernel, features }
    }

    /// `Some` if the CPU supports `kernel`; the other paths stay the fastest
    /// available.
    pub fn new(kernel: Kernel) -> Option<Dispatch> {
        let features = CpuFeatures::detect();
        kernel
            .runs_on(features)
            .then_some(Dispatch { kernel, features })
    }

    /// The dot-product kernel.
    pub fn kernel(self) -> Kernel {
        self.kernel
    }

    /// Whether f16 values can be widened with AVX + F16C.
    pub fn has_f16c(self) -> bool {
        cfg!(target_arch = "x86_64") && self.features.avx && self.features.f16c
    }
}
