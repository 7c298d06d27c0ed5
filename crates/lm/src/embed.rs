//! Embeddings: one vector per text from a decoder's final hidden states
//! (after the final norm, before the output projection), pooled over the
//! text's tokens and L2-normalised, so the dot product of two is their
//! cosine similarity. What `lm-cli embed` prints and lm-serve's
//! `/v1/embeddings` answers: all three call [`embed_tokens`].
//!
//! ```text
//! tokens   t0   t1   t2   t3
//! hidden   h0   h1   h2   h3      (final norm applied, [n_embd] each)
//! mean     (h0 + h1 + h2 + h3) / 4
//! last     h3   (the only row that saw every token, under causal attention)
//! cls      h0   (BERT's first position; a decoder's saw only t0)
//! ```

use std::str::FromStr;
use std::sync::Arc;

use lm_core::{LanguageModel, TokenId};
use lm_model::Decoder;

use crate::{Error, GgufModel};

/// How the token rows become one vector.
///
/// [`Pooling::Mean`] is the default for decoder models: a decoder not
/// trained for embeddings spreads a text's meaning over its rows, and the
/// mean of them separates paraphrases from unrelated texts better than the
/// last row alone (Muennighoff's SGPT reports the same for GPT-style
/// models); [`Pooling::Last`] is what decoders trained as embedders
/// (e5-mistral, Qwen3-Embedding) read; [`Pooling::Cls`] is the first
/// row, for encoders' `[CLS]`; under causal attention it sees only the
/// first token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's row.
    #[default]
    Mean,
    /// The last token's row.
    Last,
    /// The first token's row.
    Cls,
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Mean => "mean",
            Self::Last => "last",
            Self::Cls => "cls",
        })
    }
}

/// A name that is no [`Pooling`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pooling \"{0}\": expected mean, last or cls")]
pub struct UnknownPooling(pub String);

impl FromStr for Pooling {
    type Err = UnknownPooling;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "mean" => Ok(Self::Mean),
            "last" => Ok(Self::Last),
            "cls" => Ok(Self::Cls),
            other => Err(UnknownPooling(other.to_owned())),
        }
    }
}

/// The embedding of `tokens` under `decoder`: their final hidden states
/// pooled by `pooling`, then divided by their L2 norm (a zero vector stays
/// zero). Each call reads the tokens from a fresh state, so a text's
/// vector does not depend on what else is embedded.
///
/// Errors: no tokens, a token beyond the vocabulary, or more tokens than
/// the context holds (the model's errors).
pub fn embed_tokens(
    decoder: &Decoder,
    tokens: &[TokenId],
    pooling: Pooling,
) -> Result<Vec<f32>, Error> {
    let width = decoder.config().n_embd;
    let mut state = decoder.new_state();
    let mut hidden = Vec::new();
    decoder
        .hidden_states(&mut state, tokens, &mut hidden)
        .map_err(lm_decode::Error::from)?;
    let rows = hidden.chunks_exact(width);
    let mut vector = match pooling {
        Pooling::Mean => {
            let mut sum = vec![0.0f64; width];
            for row in rows {
                for (s, &h) in sum.iter_mut().zip(row) {
                    *s += f64::from(h);
                }
            }
            let n = tokens.len() as f64;
            sum.into_iter().map(|s| (s / n) as f32).collect()
        }
        Pooling::Last => hidden[hidden.len() - width..].to_vec(),
        Pooling::Cls => hidden[..width].to_vec(),
    };
    let norm = vector
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        vector
            .iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
    Ok(vector)
}

/// A decoder and a pooling, shareable across threads: what a server keeps
/// to answer embedding requests beside generation (the same weights).
#[derive(Debug, Clone)]
pub struct Embedder {
    decoder: Arc<Decoder>,
    pooling: Pooling,
}

impl Embedder {
    /// Embeds with `decoder`'s final hidden states, pooled by `pooling`.
    pub fn new(decoder: Arc<Decoder>, pooling: Pooling) -> Self {
        Self { decoder, pooling }
    }

    /// The length of every vector (the model's `n_embd`).
    pub fn width(&self) -> usize {
        self.decoder.config().n_embd
    }

    /// The pooling.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The most tokens one input may have (the context length).
    pub fn max_tokens(&self) -> Option<usize> {
        self.decoder.context_length()
    }

    /// The vocabulary size (ids must be below it).
    pub fn vocab_size(&self) -> usize {
        self.decoder.vocab_size()
    }

    /// [`embed_tokens`] with this decoder and pooling.
    pub fn embed_tokens(&self, tokens: &[TokenId]) -> Result<Vec<f32>, Error> {
        embed_tokens(&self.decoder, tokens, self.pooling)
    }
}

impl GgufModel {
    /// The embedding of `text` (tokenized as a completion's prompt is,
    /// special-token text parsed), pooled by `pooling`; see [`embed_tokens`].
    ///
    /// ```no_run
    /// let model = lm::load("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    /// let a = model.embed("A cat sat on the mat.", lm::Pooling::Mean)?;
    /// let b = model.embed("A kitten rested on the rug.", lm::Pooling::Mean)?;
    /// let cosine: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    /// println!("cosine similarity {cosine:.3}");
    /// # Ok::<(), lm::Error>(())
    /// ```
    pub fn embed(&self, text: &str, pooling: Pooling) -> Result<Vec<f32>, Error> {
        let tokens = self.text.tokenizer.encode(text)?;
        embed_tokens(&self.decoder, &tokens, pooling)
    }
}
