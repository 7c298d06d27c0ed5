//! `lm-cli probs`: the distribution a policy draws from, for typed logits,
//! computed by the same lm-decode `Sampler` the generator uses.

use anyhow::Result;
use lm_decode::{Sampler, SamplingConfig};

use crate::cli::ProbsArgs;
use crate::output::Output;
use crate::report::json::ProbsReport;

/// Runs `lm-cli probs`.
pub fn run(args: ProbsArgs) -> Result<()> {
    let config = args.filters.sampling();
    let mut sampler = Sampler::new(&config)?;
    let logits = args.logits.0;
    let probs = sampler.policy(&logits, &[])?.to_vec();
    let policy = describe_policy(&config);
    let mut out = Output::stdout();
    if args.json {
        return out.write_json(&ProbsReport {
            logits,
            probs,
            policy,
        });
    }
    let mut text = format!(
        "policy: {policy}\n{:>5}  {:>10}  {:>8}\n",
        "token", "logit", "prob"
    );
    for (index, (logit, prob)) in logits.iter().zip(&probs).enumerate() {
        text.push_str(&format!("{index:>5}  {logit:>10.4}  {prob:>8.4}\n"));
    }
    out.write_now(&text)?;
    Ok(())
}

/// The policy chain in the order the sampler runs it, in the flags' words
/// (`temperature 0.5 > top-k 2 > sample`), not Rust's `Debug` of the
/// sampler; XTC at probability 0 is no stage, and `--min-keep` closes the
/// line when given.
fn describe_policy(config: &SamplingConfig) -> String {
    let mut stages = vec![format!("temperature {}", config.temperature)];
    if let Some(n) = config.top_n_sigma {
        stages.push(format!("top-nsigma {n}"));
    }
    if let Some(k) = config.top_k {
        stages.push(format!("top-k {k}"));
    }
    if let Some(p) = config.typical_p {
        stages.push(format!("typical {p}"));
    }
    if let Some(p) = config.top_p {
        stages.push(format!("top-p {p}"));
    }
    if let Some(p) = config.min_p {
        stages.push(format!("min-p {p}"));
    }
    if let Some(p) = config.xtc_probability.filter(|&p| p > 0.0) {
        let threshold = config
            .xtc_threshold
            .unwrap_or(SamplingConfig::XTC_THRESHOLD);
        stages.push(format!("xtc {p} threshold {threshold}"));
    }
    stages.push(
        if config.temperature == 0.0 {
            "greedy"
        } else {
            "sample"
        }
        .to_owned(),
    );
    let mut line = stages.join(" > ");
    if let Some(n) = config.min_keep {
        line.push_str(&format!(", min-keep {n}"));
    }
    line
}
