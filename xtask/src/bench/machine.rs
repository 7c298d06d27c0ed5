//! What the bench report says about the machine: the CPU model, the
//! instruction sets it lists, our kernel path, llama.cpp's own
//! `llama_print_system_info()` and the measured read bandwidth, so a ratio
//! is never read without the hardware and the code paths that produced it.

use crate::reference;

/// The x86 instruction sets the report lists when the CPU has them, in
/// this order: what our kernels or ggml's can use (AMX is listed because a
/// VM may list it without allowing it; the peer is built with it off).
const REPORTED_SETS: &[&str] = &[
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx_vnni",
    "avx512f",
    "avx512dq",
    "avx512cd",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512vbmi",
    "avx512_vbmi2",
    "avx512_bf16",
    "avx512ifma",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
];

/// Our kernel path as the worker process chose it (`Kernel::detect()`),
/// with the `LM_KERNEL` override when one is set, and whether weights are
/// packed in panels (`lm_model::Packing`, from `LM_PACK`).
pub(super) fn our_kernel() -> String {
    let kernel = format!("{:?}", lm_model::Kernel::detect());
    let kernel = match std::env::var(lm_model::KERNEL_ENV) {
        Ok(forced) if !forced.is_empty() => format!("{kernel} ({}={forced})", lm_model::KERNEL_ENV),
        _ => kernel,
    };
    let weights = match lm_model::Kernel::configured().packing() {
        lm_model::Packing::RowMajor => "row-major weights",
        lm_model::Packing::Blocks => "Q4_0, Q4_1, Q8_0 (and Q5_0 on AVX-512) in panels",
        lm_model::Packing::All => "Q4_0, Q4_1, Q8_0 (and Q5_0, Q4_K, Q6_K on AVX-512) in panels",
    };
    format!("{kernel}, {weights}")
}

/// The report's machine lines: CPU, instruction sets, our kernel path
/// (`ours`, from a worker), llama.cpp's system info (`peer`) and the read
/// bandwidth's line (`bandwidth::readings_line`).
pub(super) fn describe(ours: Option<&str>, peer: Option<&str>, bandwidth: Option<&str>) -> String {
    let flags = reference::cpu_flags();
    let mut text = format!("CPU: {}\n", cpu_model());
    text.push_str(&format!(
        "instruction sets: {}\n",
        listed_sets(&flags).join(" ")
    ));
    text.push_str(&format!(
        "lm kernel path: {}\n",
        ours.unwrap_or("(no worker ran)")
    ));
    if let Some(peer) = peer {
        text.push_str(&format!("llama.cpp system_info: {peer}\n"));
    }
    if let Some(bandwidth) = bandwidth {
        text.push_str(bandwidth);
        text.push('\n');
    }
    text
}

/// The sets of [`REPORTED_SETS`] that `flags` lists, in that order.
fn listed_sets(flags: &[String]) -> Vec<&'static str> {
    REPORTED_SETS
        .iter()
        .copied()
        .filter(|set| flags.iter().any(|flag| flag == set))
        .collect()
}

/// The CPU model name and the number of hardware threads.
fn cpu_model() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let n_cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {n_cpus} hardware threads")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_sets_keep_the_report_order_and_skip_the_rest() {
        let flags: Vec<String> = ["sse2", "avx512bw", "avx2", "avx", "amx_tile", "avx512f"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            listed_sets(&flags),
            ["avx", "avx2", "avx512f", "avx512bw", "amx_tile"]
        );
    }
}
