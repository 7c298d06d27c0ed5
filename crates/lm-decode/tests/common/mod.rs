//! Small models for the tests: distributions fixed per prefix or per last
//! token, and a detokenizer made of fixed pieces. (The wrapper that counts
//! the positions each forward pass reads is `lm_core::Counting`.)

pub mod words;

use lm_core::{Detokenize, LanguageModel, Prefix, Rows, TokenId};
use lm_decode::{Draft, Drafter, Error, Result, Step};
use lm_model::catalog::SMOLLM2;
use std::fmt::Debug;
use std::ops::ControlFlow;

/// A model whose logits are a fixed pseudo-random function of the whole
/// prefix (values in [-2, 2)): every prefix has its own distribution, so
/// hand computation and brute force need only `logits_for`.
#[derive(Debug, Clone)]
pub struct PrefixModel {
    pub vocab_size: usize,
    pub context_length: Option<usize>,
    pub salt: u64,
}

impl PrefixModel {
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            context_length: None,
            salt: 0,
        }
    }

    pub fn with_context(mut self, max: usize) -> Self {
        self.context_length = Some(max);
        self
    }

    pub fn with_salt(mut self, salt: u64) -> Self {
        self.salt = salt;
        self
    }

    /// The logits after `prefix`, computed from scratch.
    pub fn logits_for(&self, prefix: &[TokenId]) -> Vec<f32> {
        let mut h = splitmix(self.salt ^ 0x5eed);
        for &t in prefix {
            h = splitmix(h ^ u64::from(t).wrapping_mul(0x9e37_79b9));
        }
        (0..self.vocab_size)
            .map(|i| {
                let bits = splitmix(h ^ (i as u64 + 1).wrapping_mul(0xabcd_ef01)) >> 40;
                bits as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    fn n_vocab(&self) -> usize {
        self.vocab_size
    }
}

/// SplitMix64's step: a cheap, well-mixed hash for the test models and drafters.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A model whose logits depend only on the last token: `table[last]`.
#[derive(Debug, Clone)]
pub struct TableModel {
    pub table: Vec<Vec<f32>>,
    pub context_length: Option<usize>,
}

impl TableModel {
    /// The logits after `prefix`: the row of its last token.
    pub fn logits_for(&self, prefix: &[TokenId]) -> Vec<f32> {
        let last = *prefix.last().expect("check_input rejects empty input");
        self.table[last as usize].clone()
    }

    fn n_vocab(&self) -> usize {
        self.table.len()
    }
}

/// Implements `LanguageModel` for test models that compute the logits after a
/// prefix from scratch (`logits_for`), with a vocabulary of `n_vocab()` and
/// a `context_length` field: the tokens read are the state ([`Prefix`]).
macro_rules! model_from_prefix_logits {
    ($($model:ty),+) => {$(
        impl LanguageModel for $model {
            type State = Prefix;
            fn vocab_size(&self) -> usize {
                self.n_vocab()
            }
            fn context_length(&self) -> Option<usize> {
                self.context_length
            }
            fn new_state(&self) -> Prefix {
                Prefix::default()
            }
            fn forward(
                &self,
                prefix: &mut Prefix,
                tokens: &[TokenId],
                rows: Rows,
                logits: &mut Vec<f32>,
            ) -> lm_core::Result<()> {
                prefix.read(self, tokens, rows, logits, |prefix, row| {
                    row.extend(self.logits_for(prefix))
                })
            }
        }
    )+};
}

model_from_prefix_logits!(PrefixModel, TableModel);

/// The `(id, logit)` pairs sorted best first by a full sort (higher logit,
/// then lower id): the reference for the partial selections.
pub fn full_sort(logits: &[f32]) -> Vec<(TokenId, f32)> {
    let mut sorted: Vec<(TokenId, f32)> = (0..).zip(logits.iter().copied()).collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    sorted
}

/// The ids of [`full_sort`].
pub fn full_sort_ids(logits: &[f32]) -> Vec<TokenId> {
    full_sort(logits).into_iter().map(|(id, _)| id).collect()
}

/// A check of rejected configs: `check(edit, expected)` edits a copy of
/// `base`, runs `run` on it and asserts the error. Compared through `Debug`,
/// so a NaN value matches a NaN value.
pub fn rejects<C: Clone + Debug>(
    base: C,
    run: impl Fn(&C) -> Option<Error>,
) -> impl Fn(fn(&mut C), Error) {
    move |edit, expected| {
        let mut config = base.clone();
        edit(&mut config);
        let got = run(&config);
        assert_eq!(
            format!("{got:?}"),
            format!("{:?}", Some(expected)),
            "{config:?}"
        );
    }
}

/// A drafter made of a function of the context, the most drafts the loop
/// takes and the draft to fill; it ignores how many the loop accepted.
pub struct DraftFn<F>(F);

impl<F: FnMut(&[TokenId], usize, &mut Draft)> DraftFn<F> {
    pub fn new(propose: F) -> Self {
        Self(propose)
    }
}

impl<F: FnMut(&[TokenId], usize, &mut Draft)> Drafter for DraftFn<F> {
    fn propose(&mut self, context: &[TokenId], max: usize, draft: &mut Draft) -> Result<()> {
        (self.0)(context, max, draft);
        Ok(())
    }

    fn observe(&mut self, _: usize, _: usize) {}
}

/// A hook that never stops the run.
pub fn go_on(_: &Step) -> Result<ControlFlow<()>> {
    Ok(ControlFlow::Continue(()))
}

/// SmolLM2 from the model catalog; panics with the command that fetches it
/// when it is missing.
pub fn smollm2() -> lm_model::Decoder {
    let path = SMOLLM2.path().unwrap_or_else(|err| panic!("{err}"));
    lm_model::Llama::from_gguf(path).expect("the model file loads")
}

/// Lesson 001's vocabulary.
pub const LESSON_VOCAB: [&str; 7] = ["<start>", "the", "cat", "dog", "sat", "slept", "<end>"];

/// Token i decodes to `pieces[i]`.
#[derive(Debug, Clone)]
pub struct Pieces(pub Vec<&'static str>);

impl Detokenize for Pieces {
    fn decode(&self, ids: &[TokenId]) -> String {
        ids.iter().map(|&id| self.0[id as usize]).collect()
    }
}

/// A file of the workspace, by its path from the root.
pub fn workspace_file(relative: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

/// A JSON fixture of the workspace.
pub fn read_json(relative: &str) -> serde_json::Value {
    let path = workspace_file(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// A little-endian f32 file of the workspace (a logits row).
pub fn read_f32le(relative: &str) -> Vec<f32> {
    let bytes = std::fs::read(workspace_file(relative)).unwrap();
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Logits written as a JSON array (`null` is -inf).
pub fn logits_of(value: &serde_json::Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z.as_f64().map_or(f32::NEG_INFINITY, |z| z as f32))
        .collect()
}

/// The sampler fixture (`fixtures/samplers/samplers.json`) and every vector
/// it names: the small ones, SmolLM2's 49,152-entry row, and that row with
/// every fifth id masked (the two names its `row.vectors` gives).
pub fn sampler_vectors() -> (
    serde_json::Value,
    std::collections::BTreeMap<String, Vec<f32>>,
) {
    let fixture = read_json("fixtures/samplers/samplers.json");
    let mut vectors = std::collections::BTreeMap::new();
    for vector in fixture["vectors"].as_array().unwrap() {
        let name = vector["name"].as_str().unwrap().to_owned();
        vectors.insert(name, logits_of(&vector["logits"]));
    }
    let row = read_f32le(fixture["row"]["file"].as_str().unwrap());
    assert_eq!(row.len(), fixture["row"]["len"].as_u64().unwrap() as usize);
    let masked: Vec<f32> = row
        .iter()
        .enumerate()
        .map(|(i, &z)| if i % 5 == 0 { f32::NEG_INFINITY } else { z })
        .collect();
    let names = fixture["row"]["vectors"].as_array().unwrap();
    vectors.insert(names[0].as_str().unwrap().to_owned(), row);
    vectors.insert(names[1].as_str().unwrap().to_owned(), masked);
    (fixture, vectors)
}

/// The softmax of `logits[id] / t` over `ids`, in f64, in their order: the
/// exact renormalisation a kept set's probabilities are checked against.
pub fn softmax_over<'a>(
    logits: &[f32],
    ids: impl IntoIterator<Item = &'a TokenId>,
    t: f64,
) -> Vec<f64> {
    let z: Vec<f64> = ids
        .into_iter()
        .map(|&id| f64::from(logits[id as usize]))
        .collect();
    let best = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = z.iter().map(|z| ((z - best) / t).exp()).collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

/// The probabilities of what `candidates` keep, by id.
pub fn probabilities_by_id(candidates: &mut lm_decode::sampler::Candidates) -> Vec<(TokenId, f64)> {
    let total = candidates.total_weight();
    let mut by_id: Vec<(TokenId, f64)> = candidates
        .entries()
        .iter()
        .map(|&(id, z)| (id, candidates.weight(z) / total))
        .collect();
    by_id.sort_unstable_by_key(|&(id, _)| id);
    by_id
}

/// Rows of 1 to `max_len - 1` logits in [-20, 20], about one in ten masked,
/// at least one in play (with T >= 0.5, no kept token's weight underflows).
pub fn masked_row(max_len: usize) -> impl proptest::strategy::Strategy<Value = Vec<f32>> {
    use proptest::prelude::*;
    prop::collection::vec(
        prop_oneof![9 => -20.0f32..20.0, 1 => Just(f32::NEG_INFINITY)],
        1..max_len,
    )
    .prop_filter("a token in play", |row| row.iter().any(|z| z.is_finite()))
}

/// The ids `policy` gives a positive probability, and the ids whose
/// probability in `probs` is positive in f32 (the chain's precision): the
/// same set when a chain keeps what its stage keeps.
pub fn kept_sets(
    policy: &[f32],
    probs: &[(TokenId, f64)],
) -> (
    std::collections::BTreeSet<TokenId>,
    std::collections::BTreeSet<TokenId>,
) {
    let from_chain = (0..).zip(policy).filter(|&(_, &p)| p > 0.0);
    let positive = probs.iter().filter(|&&(_, p)| p as f32 > 0.0);
    (
        from_chain.map(|(id, _)| id).collect(),
        positive.map(|&(id, _)| id).collect(),
    )
}

/// The sorted bits of the logits of `ids`: equal for two sets whose logits
/// are the same multiset (a tie broken the other way).
pub fn logit_bits<'a>(logits: &[f32], ids: impl IntoIterator<Item = &'a TokenId>) -> Vec<u32> {
    let mut bits: Vec<u32> = ids
        .into_iter()
        .map(|&id| logits[id as usize].to_bits())
        .collect();
    bits.sort_unstable();
    bits
}
