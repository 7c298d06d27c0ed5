//! The CPU features the workspace's SIMD paths use, detected once per
//! process: the one place that asks the CPU what it can run.
//!
//! lm-core's softmax takes its AVX2 build from here, and lm-model builds its
//! `Dispatch` token (the dot kernels and the f16 KV cache) on it, so every
//! SIMD path agrees on what the CPU has.

use std::sync::OnceLock;

/// Who made the CPU (`cpuid` leaf 0's vendor string). The SIMD paths run
/// on any maker's cores; some of their tuning follows what was measured on
/// each (lm-model's panel kernels prefetch more on Intel's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CpuMaker {
    /// "GenuineIntel".
    Intel,
    /// "AuthenticAMD".
    Amd,
    /// Any other maker, or a target without `cpuid`.
    #[default]
    Other,
}

/// The x86-64 extensions the SIMD paths use (all `false` on other
/// targets), and the CPU's maker.
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
    /// AVX-512 Foundation: 512-bit vectors and mask registers.
    pub avx512f: bool,
    /// AVX-512 Byte and Word: byte and 16-bit operations on 512-bit vectors.
    pub avx512bw: bool,
    /// AVX-512 Vector Length: the AVX-512 instructions on 128- and 256-bit vectors.
    pub avx512vl: bool,
    /// AVX-512 VNNI: `vpdpbusd` (four byte products summed into each i32
    /// lane) on 512-bit vectors.
    pub avx512vnni: bool,
    /// AVX-VNNI: the VEX-encoded `vpdpbusd` on 256-bit vectors, for CPUs
    /// with VNNI but without AVX-512 (Alder Lake and later).
    pub avxvnni: bool,
    /// Who made the CPU.
    pub maker: CpuMaker,
}

impl CpuFeatures {
    /// No extension: what the portable paths assume.
    pub const NONE: CpuFeatures = CpuFeatures {
        avx: false,
        avx2: false,
        fma: false,
        f16c: false,
        avx512f: false,
        avx512bw: false,
        avx512vl: false,
        avx512vnni: false,
        avxvnni: false,
        maker: CpuMaker::Other,
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
        avx512f: std::arch::is_x86_feature_detected!("avx512f"),
        avx512bw: std::arch::is_x86_feature_detected!("avx512bw"),
        avx512vl: std::arch::is_x86_feature_detected!("avx512vl"),
        avx512vnni: std::arch::is_x86_feature_detected!("avx512vnni"),
        avxvnni: std::arch::is_x86_feature_detected!("avxvnni"),
        maker: maker(),
    }
}

/// The maker `cpuid` leaf 0 names: twelve bytes in ebx, edx, ecx.
#[cfg(target_arch = "x86_64")]
fn maker() -> CpuMaker {
    let leaf = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    for (bytes, word) in vendor
        .chunks_exact_mut(4)
        .zip([leaf.ebx, leaf.edx, leaf.ecx])
    {
        bytes.copy_from_slice(&word.to_le_bytes());
    }
    match &vendor {
        b"GenuineIntel" => CpuMaker::Intel,
        b"AuthenticAMD" => CpuMaker::Amd,
        _ => CpuMaker::Other,
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
        // Every AVX-512 extension and AVX-VNNI come with AVX2.
        let wider = features.avx512f
            || features.avx512bw
            || features.avx512vl
            || features.avx512vnni
            || features.avxvnni;
        assert!(!wider || features.avx2, "{features:?}");
    }

    /// The maker agrees with Linux's reading of the same `cpuid` leaf
    /// (`vendor_id` in /proc/cpuinfo).
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn maker_agrees_with_proc_cpuinfo() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let vendor = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("vendor_id"))
            .and_then(|rest| rest.split(':').nth(1))
            .expect("a vendor_id line")
            .trim();
        let expected = match vendor {
            "GenuineIntel" => CpuMaker::Intel,
            "AuthenticAMD" => CpuMaker::Amd,
            _ => CpuMaker::Other,
        };
        assert_eq!(CpuFeatures::detect().maker, expected, "vendor_id {vendor}");
    }
}
