//! Scoring a text: how likely a model finds each word of it, and in total.
//! Run: `cargo run -p lm-decode --example score_text`

use lm_core::TokenId;
use lm_model::NgramModel;
use lm_model::ngram::{TrainOptions, split_words};

/// The training text: one sentence per line.
pub const CORPUS: &str = "the cat sat on the mat
the dog sat on the rug
the cat saw the dog
the dog saw the cat on the mat";

/// A trigram count model of `CORPUS`, smoothed with Kneser-Ney. A corpus
/// this small cannot estimate the discounts, so the default options use
/// lmplz's fallback discounts (`model.discount_fallbacks()` says where).
pub fn train() -> lm_model::Result<NgramModel> {
    let options = TrainOptions::default();
    Ok(lm_model::ngram::train(CORPUS.as_bytes(), &options, |_| {})?)
}

/// The ids of `text`'s words, then the end-of-sentence token `</s>`;
/// unseen words become `<unk>`.
pub fn ids(model: &NgramModel, text: &str) -> Vec<TokenId> {
    let vocab = model.vocab();
    let mut ids: Vec<TokenId> = split_words(text).map(|w| vocab.id_or_unk(w)).collect();
    ids.push(vocab.eos());
    ids
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = train()?;
    // The count model starts every sentence after `<s>`; that is the prompt.
    let prompt = [model.vocab().bos()];
    for text in ["the cat sat on the rug", "rug the on sat cat the"] {
        let continuation = ids(&model, text);
        // One pass through the model: ln p of each token given all before it.
        let score = lm_decode::score_continuation(&model, &prompt, &continuation)?;
        println!("{text:?}");
        for (&id, logprob) in score.tokens.iter().zip(&score.logprobs) {
            let word = model.vocab().word(id).unwrap_or("?");
            println!("  {word:<6} ln p {logprob:>7.3}");
        }
        // Perplexity: the model was as unsure as a uniform pick among this many.
        let perplexity = score.perplexity();
        println!(
            "  total ln p {:.3}, perplexity {perplexity:.2}",
            score.logprob
        );
    }
    Ok(())
}
