//! The CPU features the workspace's SIMD paths use, detected once per
//! process: the one place that asks the CPU what it can run.
//!
//! lm-core's softmax takes its AVX2 build from here, and lm-model builds its
//! `Dispatch` token (the dot kernels and the f16 KV cache) on it, so every
//! SIMD path agrees on what the CPU has.

use std::sync::OnceLock;

/// The x86-64 extensions the SIMD paths use; all `false` on other targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct CpuFeatures {
    /// AVX: 256-bit float vectors.
    pub avx: bool,
    /// AVX2: 256-bit integer vectors (softmax weights, quantized dot products).
    pub avx2: bool,
    /// Fused multiply-add.
    pub fma: bool,
    /// F16C: f16 to f32 conversions (the f16 KV cache, f16 weights).
    pub f16c: bool,
}

impl CpuFeatures {
    /// No extension: what the portable paths assume.
    pub const NONE: CpuFeatures = CpuFeatures {
        avx: false,
        avx2: false,
        fma: false,
        f16c: false,
    };

    /// The features of this CPU, detected on the first call and cached.
    pub fn detect() -> CpuFeatures {
        static DETECTED: OnceLock<CpuFeatures> = OnceLock::new();
        *DETECTED.get_or_init(detect_uncached)
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_uncached() -> CpuFeatures {
    CpuFeatures {
        avx: std::arch::is_x86_feature_detected!("avx"),
        avx2: std::arch::is_x86_feature_detected!("avx2"),
        fma: std::arch::is_x86_feature_detected!("fma"),
        f16c: std::arch::is_x86_feature_detected!("f16c"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_uncached() -> CpuFeatures {
    CpuFeatures::NONE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_is_cached_and_consistent() {
        let features = CpuFeatures::detect();
        assert_eq!(features, CpuFeatures::detect());
        // AVX2 and F16C imply AVX on every CPU that has them.
        assert!(
            !(features.avx2 || features.f16c) || features.avx,
            "{features:?}"
        );
    }
}
