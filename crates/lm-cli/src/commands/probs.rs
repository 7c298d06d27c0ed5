//! `lm-cli probs`: the distribution a policy draws from, for typed logits,
//! computed by the same lm-decode `Sampler` the generator uses.

use anyhow::Result;
use lm_decode::{Sampler, SamplingConfig, Stage};

use crate::cli::ProbsArgs;
use crate::output::Output;
use crate::report::json::ProbsReport;

/// Runs `lm-cli probs`.
pub fn run(args: ProbsArgs) -> Result<()> {
    let config = args.filters.sampling();
    let mut sampler = Sampler::new(&config)?;
    let logits = args.logits.0;
    let probs = sampler.policy(&logits, &[])?.to_vec();
    let policy = describe_policy(&config, &sampler);
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

/// The policy chain in the order the sampler runs it ([`Sampler::stages`],
/// so a `--samplers` order and mirostat show where they run), in the
/// flags' words (`temperature 0.5 > top-k 2 > sample`), not Rust's `Debug`
/// of the sampler; a stage that is off (XTC at probability 0) is not in
/// the chain, and `--min-keep` closes the line when given.
fn describe_policy(config: &SamplingConfig, sampler: &Sampler) -> String {
    let mut stages: Vec<String> = sampler
        .stages()
        .map(|stage| describe_stage(stage, config))
        .collect();
    stages.push(
        if sampler.is_greedy() {
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

/// One stage and its settings, named as its flag names them.
fn describe_stage(stage: Stage, config: &SamplingConfig) -> String {
    let value = |setting: Option<f32>| setting.map_or_else(String::new, |v| v.to_string());
    match stage {
        Stage::Temperature => match config.dynatemp_range {
            Some(range) => format!(
                "temperature {} dynatemp-range {range} dynatemp-exp {}",
                config.temperature,
                config
                    .dynatemp_exponent
                    .unwrap_or(SamplingConfig::DYNATEMP_EXPONENT)
            ),
            None => format!("temperature {}", config.temperature),
        },
        Stage::TopNSigma => format!("top-nsigma {}", value(config.top_n_sigma)),
        Stage::TopK => format!("top-k {}", config.top_k.unwrap_or_default()),
        Stage::Typical => format!("typical {}", value(config.typical_p)),
        Stage::TopP => format!("top-p {}", value(config.top_p)),
        Stage::MinP => format!("min-p {}", value(config.min_p)),
        Stage::Xtc => format!(
            "xtc {} threshold {}",
            value(config.xtc_probability),
            config
                .xtc_threshold
                .unwrap_or(SamplingConfig::XTC_THRESHOLD)
        ),
        Stage::EpsilonCutoff => format!("epsilon-cutoff {}", value(config.epsilon_cutoff)),
        Stage::EtaCutoff => format!("eta-cutoff {}", value(config.eta_cutoff)),
        Stage::Mirostat => format!(
            "mirostat {} ent {} lr {}",
            config.mirostat.unwrap_or_default(),
            config.mirostat_tau.unwrap_or(SamplingConfig::MIROSTAT_TAU),
            config.mirostat_eta.unwrap_or(SamplingConfig::MIROSTAT_ETA)
        ),
        other => other.name().to_owned(),
    }
}
