//! `lm-cli probs`: the distribution a policy draws from, for typed logits,
//! computed by the same lm-decode `Sampler` the generator uses.

use anyhow::Result;
use lm_decode::Sampler;

use crate::cli::ProbsArgs;
use crate::output::Output;
use crate::report::json::ProbsReport;

/// Runs `lm-cli probs`.
pub fn run(args: ProbsArgs) -> Result<()> {
    let mut sampler = Sampler::new(&args.filters.sampling())?;
    let logits = args.logits.0;
    let probs = sampler.policy(&logits, &[])?.to_vec();
    let policy = format!("{sampler:?}");
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
