//! `lm-cli enumerate`: every continuation of n tokens scored and ranked, and
//! the greedy continuation's rank (lesson 001: 7^4 = 2,401 continuations).
//! Only the `--top` best are held (lm-decode's `enumerate_best`).

use anyhow::{Context, Result};
use lm_core::LanguageModel;
use lm_decode::enumerate_best;

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
        // Only the continuations shown are kept (a heap of --top), so a
        // huge --limit costs time, not memory.
        let n_best = (args.top != 0).then_some(args.top);
        let all = enumerate_best(model, &prompt_ids, args.steps, args.limit, n_best)
            .with_context(|| {
                format!(
                    "cannot enumerate {} steps over a vocabulary of {} (use fewer --steps, or raise --limit)",
                    args.steps,
                    model.vocab_size()
                )
            })?;
        let total = all.n_total;
        let n_shown = all.continuations.len();
        let greedy_prob = all.greedy_logprob.exp();
        let continuations = all
            .continuations
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
