//! A count model from a string: train a trigram model, score a sentence as
//! KenLM's `query` does, and sample a continuation with lm-decode's loop.
//!
//! Run it with `cargo run -p lm-model --example count_model`. (lm-model's
//! tests compile this file as a module and check what it prints.)

use lm_core::Detokenize;
use lm_decode::{Generation, GenerationConfig, SamplingConfig, generate};
use lm_model::NgramModel;
use lm_model::ngram::{EOS, TrainOptions, split_words, train};

/// The training text: one sentence a line. Far too little text for
/// Kneser-Ney to estimate its discounts, which is what the default options
/// are for: they fall back to `lmplz --discount_fallback`'s values.
pub const CORPUS: &str = "\
the cat sat on the mat .
the dog sat on the rug .
the cat saw the dog .
a dog chased a cat .
";

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Train: each line a sentence, split into words and punctuation. The
    //    closure hears how many bytes were read so far; we need no progress.
    let model = train(CORPUS.as_bytes(), &TrainOptions::default(), |_| {})?;
    let vocab = model.vocab();
    println!("order {}, {} words", model.order(), vocab.len());
    // The model says which orders used the fallback discounts.
    for fallback in model.discount_fallbacks() {
        println!("note: {fallback}");
    }

    // 2. Score a sentence: from the start-of-sentence context `<s>`, with
    //    `</s>` scored at the end. Each token gets log10 p(token | what came
    //    before) and the length of the n-gram the model found for it.
    let sentence = "the dog sat on the mat .";
    let score = model.score(split_words(sentence), true, true);
    for (token, word) in split_words(sentence).chain([EOS]).zip(&score.words) {
        let (log10_p, n) = (word.log10_prob, word.ngram_length);
        println!("{token:>5}  log10 p = {log10_p:8.4}  ({n}-gram)");
    }
    let (total, perplexity) = (score.total_log10(), score.perplexity());
    println!("total log10 p = {total:.4}, perplexity {perplexity:.3}");

    // 3. Sample how "the cat" goes on, with seed 3.
    let run = continue_text(&model, "the cat", 3)?;
    // Decoding glues punctuation to the word before it and writes `</s>`
    // as the end of the line.
    let text = model.decode(&[run.prompt.as_slice(), &run.tokens].concat());
    print!("{text}");
    let (reason, n) = (run.stop_reason, run.tokens.len());
    println!("stopped by {reason:?} after {n} tokens");
    Ok(())
}

/// Samples a continuation of `prompt`. `NgramModel` is an
/// `lm_core::LanguageModel` (its logits are natural-log probabilities), so
/// lm-decode's one loop runs it. `<unk>` stands for every unknown word and
/// has no text, so the sampler bans it; `</s>` ends the sentence. The seed
/// makes the run the same every time, on every machine.
pub fn continue_text(model: &NgramModel, prompt: &str, seed: u64) -> lm_decode::Result<Generation> {
    let vocab = model.vocab();
    let prompt: Vec<_> = split_words(prompt).map(|w| vocab.id_or_unk(w)).collect();
    let config = GenerationConfig {
        max_new_tokens: 12,
        sampling: SamplingConfig {
            seed,
            banned_tokens: vec![vocab.unk()],
            ..SamplingConfig::default()
        },
        end_tokens: vec![vocab.eos()],
        ..GenerationConfig::default()
    };
    generate(model, &prompt, &config, Some(model))
}
