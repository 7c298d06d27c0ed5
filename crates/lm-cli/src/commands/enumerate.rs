//! `lm-cli enumerate`: every continuation of n tokens scored and ranked, and
//! the greedy continuation's rank (lesson 001: 7^4 = 2,401 continuations).

use anyhow::{Context, Result};
use lm_core::LanguageModel;
use lm_decode::enumerate_continuations;

use crate::cli::EnumerateArgs;
use crate::output::Output;
use crate::report::json::{ContinuationReport, EnumerateReport};
use crate::report::printable;
use crate::spec::ModelTask;
use crate::text::TextCodec;

/// Runs `lm-cli enumerate`.
pub fn run(args: EnumerateArgs) -> Result<()> {
    let (loaded, options) = crate::commands::load_model(&args.model)?;
    loaded.run(options, args)
}

/// The enumeration, written once for every model type.
impl ModelTask for EnumerateArgs {
    type Output = ();

    fn run<M: LanguageModel>(self, model: &M, codec: &TextCodec) -> Result<()> {
        let args = &self;
        let prompt_ids = codec.encode_prompt(&args.prompt)?;
        let all = enumerate_continuations(model, &prompt_ids, args.steps, args.limit)
            .with_context(|| {
                format!(
                    "cannot enumerate {} steps over a vocabulary of {} (use fewer --steps, or raise --limit)",
                    args.steps,
                    model.vocab_size()
                )
            })?;
        let total = all.continuations.len();
        let n_shown = if args.top == 0 {
            total
        } else {
            args.top.min(total)
        };
        let greedy_prob = all
            .continuations
            .get(all.greedy_rank.wrapping_sub(1))
            .map_or(0.0, |c| c.logprob.exp());
        let continuations = all.continuations[..n_shown]
            .iter()
            .enumerate()
            .map(|(index, c)| ContinuationReport {
                rank: index + 1,
                ids: c.tokens.clone(),
                text: codec.decode_ids(&c.tokens),
                prob: c.logprob.exp(),
                logprob: c.logprob,
            })
            .collect();
        let report = EnumerateReport {
            prompt_ids,
            steps: args.steps,
            total,
            continuations,
            greedy: all.greedy.clone(),
            greedy_rank: all.greedy_rank,
            greedy_prob,
        };
        let mut out = Output::stdout();
        if args.json {
            return out.write_json(&report);
        }
        let mut text = format!(
            "{total} continuations of {} tokens; the {n_shown} most probable:\n{:>6}  {:>10}  {:>10}  continuation\n",
            args.steps, "rank", "p", "ln p"
        );
        for c in &report.continuations {
            let mark = if c.ids == report.greedy {
                "   <- greedy"
            } else {
                ""
            };
            text.push_str(&format!(
                "{:>6}  {:>10.6}  {:>10.4}  {}{mark}\n",
                c.rank,
                c.prob,
                c.logprob,
                printable(&c.text)
            ));
        }
        text.push_str(&format!(
            "greedy: {} (p = {:.6}) ranks {} of {total}\n",
            printable(&codec.decode_ids(&report.greedy)),
            report.greedy_prob,
            report.greedy_rank
        ));
        out.write_now(&text)?;
        Ok(())
    }
}
