//! Your own model, top-p sampled and beam-searched: `cargo run -p lm-decode --example custom_model`

use lm_core::{Detokenize, LanguageModel, Prefix, Rows, TokenId};
use lm_decode::{BeamConfig, GenerationConfig};

/// Token id `i` is `WORDS[i]`; a text starts at `<s>` (0), ends at `</s>` (6).
pub const WORDS: [&str; 7] = ["<s>", "the", "cat", "dog", "sat", "ran", "</s>"];
const NO: f32 = f32::NEG_INFINITY; // a logit that never lets the token follow

/// Row `t` holds the logits of the token after token `t`.
#[rustfmt::skip]
const TABLE: [[f32; 7]; 7] = [
    // <s>  the  cat  dog  sat  ran  </s>
    [NO, 3.0, NO,  NO,  NO,  NO,  NO ], // after <s>: always "the"
    [NO, NO,  1.5, 1.0, NO,  NO,  NO ], // after "the": cat or dog
    [NO, NO,  NO,  NO,  2.0, 1.0, NO ], // after "cat": sat, sometimes ran
    [NO, NO,  NO,  NO,  0.5, 2.0, NO ], // after "dog": ran, sometimes sat
    [NO, 0.5, NO,  NO,  NO,  NO,  1.0], // after "sat": the end, or more
    [NO, 0.5, NO,  NO,  NO,  NO,  1.0], // after "ran": likewise
    [NO, 1.0, NO,  NO,  NO,  NO,  NO ], // after </s> (never read here)
];

/// A bigram model: its state is just the tokens read (lm-core's `Prefix`).
pub(crate) struct Bigram;

impl LanguageModel for Bigram {
    type State = Prefix;
    fn vocab_size(&self) -> usize {
        WORDS.len()
    }
    fn context_length(&self) -> Option<usize> {
        None // no context bound
    }
    fn new_state(&self) -> Prefix {
        Prefix::default()
    }
    fn forward(
        &self,
        state: &mut Prefix,
        new_ids: &[TokenId],
        rows: Rows,
        out: &mut Vec<f32>,
    ) -> lm_core::Result<()> {
        // Prefix::read checks the ids (in range, not empty), appends them and
        // asks for the row after each prefix that `rows` wants.
        state.read(self, new_ids, rows, out, |prefix, row| {
            if let Some(&last) = prefix.last() {
                row.extend_from_slice(&TABLE[last as usize]); // the row after the last token
            }
        })
    }
}

impl Detokenize for Bigram {
    fn decode(&self, ids: &[TokenId]) -> String {
        let words: Vec<&str> = ids.iter().map(|&id| WORDS[id as usize]).collect();
        words.join(" ")
    }
}

fn main() -> lm_decode::Result<()> {
    let mut config = GenerationConfig {
        end_tokens: vec![6], // up to 20 new tokens, or until </s>
        ..Default::default()
    };
    config.sampling.top_p = Some(0.9); // sample among the likeliest 90%
    let run = lm_decode::generate(&Bigram, &[0], &config, Some(&Bigram))?;
    println!("top-p sample: {}", run.text.unwrap_or_default());
    let beams = BeamConfig {
        end_tokens: vec![6], // 4 beams, length penalty alpha 0.6
        ..Default::default()
    };
    for beam in lm_decode::beam_search(&Bigram, &[0], &beams)? {
        let (text, logprob) = (Bigram.decode(&beam.tokens), beam.logprob);
        println!("beam: {text:<30} ln p {logprob:.3}");
    }
    Ok(())
}
