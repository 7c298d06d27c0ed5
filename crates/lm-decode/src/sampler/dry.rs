//! DRY, "don't repeat yourself" (p-e-w, text-generation-webui pull request
//! 5677, 2024; koboldcpp's implementation by pi6am, pull request 982, which
//! llama.cpp ports as `llama_sampler_init_dry`): penalise a token that would
//! extend a sequence of tokens that already occurred in the history, more
//! the longer the sequence.
//!
//! ```text
//! w        = the last penalty_last_n tokens of the history (or all of it)
//! L        = tokens after the last sequence breaker in w (|w| if none)
//! n_j      = min(L, how many tokens end at w_j as they end at the end of w)
//! n(t)     = max { n_j : w_{j+1} = t },  over j < |w| - 1
//! z_t     -= multiplier * base^min(n(t) - allowed_length, e_max)
//!            for n(t) >= allowed_length, unless t's text holds a breaker
//! e_max    = floor(88.7228391 / ln base)   (in f32; no cap for base <= 1.000001)
//! ```
//!
//! `e_max` keeps `base^e` below f32's largest value; the multiplier can
//! still push the penalty past it, and then the logit becomes -inf, as in
//! llama.cpp.
//!
//! As llama.cpp: every `n_j` comes from one Z-algorithm pass over the
//! reversed window (O(|w|)), the breaker scan runs backwards from the end
//! and stops at the first breaker, nothing changes when the window holds
//! at most `allowed_length` tokens or when fewer than `allowed_length`
//! tokens follow the last breaker, the power is taken in f64 and the
//! penalty rounded to f32 before it is subtracted, and a token whose own
//! text holds a breaker is never penalised. `allowed_length` 0 is kept
//! as llama.cpp reads it: every token that follows any token of the
//! window gets at least `multiplier`.
//!
//! Sequence breakers are strings (llama.cpp's default: newline, `:`, `"`
//! and `*`), compiled once over the vocabulary into [`SequenceBreakers`]: a
//! token whose text holds a breaker breaks a sequence on its own. A breaker
//! split across tokens (a token whose text ends with the breaker's first
//! characters, then the tokens spelling the rest) also breaks one.
//! llama.cpp matches that rest against its own tokenization of it; lm-decode
//! has only a detokenizer, so it matches the rest by text: the tokens after
//! the head must spell it exactly, token boundaries included. The two
//! differ only for a history that spells the rest with other tokens than
//! the tokenizer would (for example `#`, `#` where the tokenizer makes `##`),
//! which this stage also counts as a breaker, and for a rest of more than
//! 20 tokens, which llama.cpp cuts to its first 20. Single-token breakers,
//! the default set among them, match llama.cpp exactly. Breakers are cut to
//! 40 bytes, as llama.cpp cuts them (here at a character boundary). A
//! token's text is `Detokenize::decode` of it alone: a token holding part
//! of a multi-byte character reads as U+FFFD there where llama.cpp sees the
//! raw bytes, which can matter only for a breaker that is not ASCII.
//!
//! Cost per step: O(|w|) time, and a scratch the Z-algorithm cannot do
//! without (it reads back earlier entries of its array): 4 bytes a window
//! token plus a map of the tokens that would extend a repeat, kept in the
//! stage between calls, so a warm step allocates nothing.
//!
//! `penalty_last_n`: `None` is the whole history, `Some(0)` turns DRY off.
//! The llama.cpp of llama-cpp-python 0.3.36 reads -1 as 0 (off) where older
//! ones read it as the context size; the whole history is this stage's
//! spelling of that older meaning.

use super::{History, LogitTransform};
use crate::error::{Error, Result};
use lm_core::{Detokenize, TokenId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// llama.cpp's cut of a breaker, in bytes.
const MAX_BREAKER_BYTES: usize = 40;

/// `ln` of the largest f32, llama.cpp's bound on the penalty's exponent
/// (the f32 nearest its `88.7228391f`).
const FLOAT_MAX_LOG: f32 = 88.722_84;

/// A token's roles in [`SequenceBreakers`]' table, one bit each.
const WHOLE: u8 = 1;
const HEAD: u8 = 2;
const FRAGMENT: u8 = 4;

/// The breakers compiled over a vocabulary (which tokens break a sequence).
///
/// Per token, one byte of roles: its text holds a breaker (`WHOLE`), its
/// text ends with the start of a breaker (`HEAD`, with the rests that
/// complete it), or its text could spell part of such a rest (`FRAGMENT`,
/// with its text). Only heads and fragments keep text; for the default
/// breakers there are none.
///
/// ```
/// use lm_decode::sampler::SequenceBreakers;
/// struct Words(Vec<&'static str>);
/// impl lm_core::Detokenize for Words {
///     fn decode(&self, ids: &[u32]) -> String {
///         ids.iter().map(|&id| self.0[id as usize]).collect()
///     }
/// }
/// let vocab = Words(vec!["a", "b", ":", "\n"]);
/// let breakers: Vec<String> = SequenceBreakers::DEFAULT.iter().map(|b| b.to_string()).collect();
/// let table = SequenceBreakers::new(&breakers, 4, &vocab).unwrap();
/// assert_eq!(table.len(), 4);
/// assert!(SequenceBreakers::new(&["".into()], 4, &vocab).is_err());
/// ```
#[derive(Clone, Default)]
pub struct SequenceBreakers {
    n_breakers: usize,
    roles: Vec<u8>,
    /// The rests of the breakers a head token starts, by id.
    heads: Vec<(TokenId, Vec<Box<[u8]>>)>,
    /// The text of the fragment tokens, by id.
    fragments: Vec<(TokenId, Box<[u8]>)>,
}

impl SequenceBreakers {
    /// llama.cpp's default breakers.
    pub const DEFAULT: [&'static str; 4] = ["\n", ":", "\"", "*"];

    /// Scans every token's text once (`detokenizer.decode(&[id])`); an empty
    /// breaker is [`Error::EmptyDryBreaker`].
    pub fn new(
        breakers: &[String],
        vocab_size: usize,
        detokenizer: &dyn Detokenize,
    ) -> Result<Self> {
        let mut cut = Vec::with_capacity(breakers.len());
        for (index, breaker) in breakers.iter().enumerate() {
            if breaker.is_empty() {
                return Err(Error::EmptyDryBreaker { index });
            }
            let mut end = breaker.len().min(MAX_BREAKER_BYTES);
            while !breaker.is_char_boundary(end) {
                end -= 1;
            }
            cut.push(breaker.as_bytes()[..end].to_vec());
        }
        let mut table = Self {
            n_breakers: breakers.len(),
            ..Self::default()
        };
        if cut.is_empty() {
            return Ok(table);
        }
        table.roles = vec![0; vocab_size];
        for (id, role) in (0..).zip(table.roles.iter_mut()) {
            let text = detokenizer.decode(&[id]).into_bytes();
            let (whole, rests) = roles_of(&text, &cut);
            *role |= if whole { WHOLE } else { 0 };
            if !rests.is_empty() {
                *role |= HEAD;
                table.heads.push((id, rests));
            }
            if is_fragment(&text, &cut) {
                *role |= FRAGMENT;
                table.fragments.push((id, text.into_boxed_slice()));
            }
        }
        Ok(table)
    }

    /// No breakers at all.
    pub fn none() -> Self {
        Self::default()
    }

    /// The number of breaker strings.
    pub fn len(&self) -> usize {
        self.n_breakers
    }

    /// True when there are no breakers.
    pub fn is_empty(&self) -> bool {
        self.n_breakers == 0
    }

    fn role(&self, id: TokenId) -> u8 {
        self.roles.get(id as usize).copied().unwrap_or(0)
    }

    /// Whether `id`'s own text holds a breaker.
    fn is_whole(&self, id: TokenId) -> bool {
        self.role(id) & WHOLE != 0
    }

    /// The text of a fragment token.
    fn fragment(&self, id: TokenId) -> Option<&[u8]> {
        if self.role(id) & FRAGMENT == 0 {
            return None;
        }
        let at = self.fragments.binary_search_by_key(&id, |&(t, _)| t).ok()?;
        Some(&self.fragments[at].1)
    }

    /// How many tokens of `after` complete the longest breaker that `id`
    /// starts (0 when `id` holds one whole), or `None` when none is
    /// completed.
    fn breaker_tail(&self, id: TokenId, after: &[TokenId]) -> Option<usize> {
        let role = self.role(id);
        let mut longest = (role & WHOLE != 0).then_some(0);
        if role & HEAD == 0 {
            return longest;
        }
        let at = self.heads.binary_search_by_key(&id, |&(t, _)| t).ok()?;
        for rest in &self.heads[at].1 {
            if let Some(n) = self.spells(rest, after) {
                longest = longest.max(Some(n));
            }
        }
        longest
    }

    /// How many leading tokens of `tokens` spell `rest` exactly, if they do.
    fn spells(&self, mut rest: &[u8], tokens: &[TokenId]) -> Option<usize> {
        for (n, &id) in tokens.iter().enumerate() {
            rest = rest.strip_prefix(self.fragment(id)?)?;
            if rest.is_empty() {
                return Some(n + 1);
            }
        }
        None
    }

    /// The number of tokens after the last breaker of `window` (all of
    /// them when it has none): no repeated sequence extends further back.
    fn repeat_limit(&self, window: &[TokenId]) -> usize {
        if self.roles.is_empty() {
            return window.len();
        }
        for (i, position) in (0..window.len()).rev().enumerate() {
            let after = &window[position + 1..];
            if let Some(tail) = self.breaker_tail(window[position], after) {
                return i - tail;
            }
        }
        window.len()
    }
}

/// Whether `text` holds a breaker, and the rests of the breakers it
/// starts: `b[k..]` for each breaker `b` it does not hold and each
/// `1 <= k < |b|` such that `text` ends with `b[..k]` (llama.cpp's
/// `get_overlapping_token_sequences`, with rests kept as text).
fn roles_of(text: &[u8], breakers: &[Vec<u8>]) -> (bool, Vec<Box<[u8]>>) {
    let mut whole = false;
    let mut rests: Vec<Box<[u8]>> = Vec::new();
    for breaker in breakers {
        if contains(text, breaker) {
            whole = true;
            continue;
        }
        for k in 1..breaker.len() {
            let rest = &breaker[k..];
            if text.ends_with(&breaker[..k]) && !rests.iter().any(|r| **r == *rest) {
                rests.push(rest.into());
            }
        }
    }
    (whole, rests)
}

/// Whether `text` could spell part of a breaker's rest: it is a non-empty
/// prefix of some `b[k..]`, `k >= 1`.
fn is_fragment(text: &[u8], breakers: &[Vec<u8>]) -> bool {
    !text.is_empty()
        && breakers
            .iter()
            .any(|b| (1..b.len()).any(|k| b[k..].starts_with(text)))
}

fn contains(text: &[u8], needle: &[u8]) -> bool {
    text.windows(needle.len()).any(|w| w == needle)
}

impl fmt::Debug for SequenceBreakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SequenceBreakers")
            .field("breakers", &self.n_breakers)
            .field("heads", &self.heads.len())
            .finish_non_exhaustive()
    }
}

/// The DRY penalty on tokens that would extend a repeated sequence.
///
/// ```
/// use lm_decode::sampler::{Dry, History, LogitTransform, SequenceBreakers, TokenCounts};
/// use std::sync::Arc;
/// // 0 1 2 0 1: the last two tokens occurred before, followed by 2, so 2
/// // would repeat 2 tokens: z_2 -= 1.0 * 2^(2 - 2).
/// let dry = Dry::new(1.0, 2.0, 2, None, Arc::new(SequenceBreakers::none())).unwrap();
/// let history = [0, 1, 2, 0, 1];
/// let mut logits = [0.5f32; 4];
/// dry.apply(&mut logits, &History::new(&history, &TokenCounts::default()));
/// assert_eq!(logits, [0.5, 0.5, -0.5, 0.5]);
/// ```
pub struct Dry {
    multiplier: f32,
    base: f32,
    allowed_length: usize,
    penalty_last_n: Option<usize>,
    breakers: Arc<SequenceBreakers>,
    /// The cap on the penalty's exponent (0: none).
    max_exponent: usize,
    /// Kept between calls so a step allocates nothing once warm (taken with
    /// `try_lock`: a call that finds it busy uses a scratch of its own).
    scratch: Mutex<Scratch>,
}

/// The Z-array of the window and the longest repeat each token would
/// extend: llama.cpp's `dry_repeat_count` and `dry_max_token_repeat`.
#[derive(Default)]
struct Scratch {
    z: Vec<u32>,
    longest: HashMap<TokenId, usize>,
}

impl Dry {
    /// Checks the settings: a multiplier that is not finite and at least 0
    /// gives [`Error::InvalidDryMultiplier`], a base that is not finite and
    /// at least 1 [`Error::InvalidDryBase`]. `penalty_last_n`: `None` is the
    /// whole history, `Some(0)` turns DRY off (as a multiplier of 0 does).
    pub fn new(
        multiplier: f32,
        base: f32,
        allowed_length: usize,
        penalty_last_n: Option<usize>,
        breakers: Arc<SequenceBreakers>,
    ) -> Result<Self> {
        let is_valid = multiplier.is_finite() && multiplier >= 0.0;
        let multiplier = Error::check(multiplier, is_valid, |value| Error::InvalidDryMultiplier {
            value,
        })?;
        let is_valid = base.is_finite() && base >= 1.0;
        let base = Error::check(base, is_valid, |value| Error::InvalidDryBase { value })?;
        // As llama.cpp: f32 division, truncated.
        let max_exponent = if base > 1.000_001 {
            (FLOAT_MAX_LOG / base.ln()) as usize
        } else {
            0
        };
        Ok(Self {
            multiplier,
            base,
            allowed_length,
            penalty_last_n,
            breakers,
            max_exponent,
            scratch: Mutex::default(),
        })
    }

    /// The penalty for a token that would extend a repeat of `n` tokens
    /// (`n >= allowed_length`), in f64 then rounded to f32 as llama.cpp's
    /// `float penalty = multiplier * std::pow(base, exponent)`.
    fn penalty(&self, n: usize) -> f32 {
        let mut exponent = n - self.allowed_length;
        if self.max_exponent > 0 {
            exponent = exponent.min(self.max_exponent);
        }
        (f64::from(self.multiplier) * f64::from(self.base).powf(exponent as f64)) as f32
    }

    /// Fills `scratch.longest` with the longest repeat each token would
    /// extend, for the repeats of at least `allowed_length` tokens.
    fn longest_repeats(&self, window: &[TokenId], limit: usize, scratch: &mut Scratch) {
        reverse_z(window, &mut scratch.z);
        scratch.longest.clear();
        let n = window.len();
        // z[k] is the repeat ending at position n - 1 - k, followed by the
        // token at n - k.
        for k in 1..n {
            let repeat = (scratch.z[k] as usize).min(limit);
            if repeat >= self.allowed_length {
                let longest = scratch.longest.entry(window[n - k]).or_insert(repeat);
                *longest = (*longest).max(repeat);
            }
        }
    }
}

/// The Z-array of `window` read backwards: `z[k]` is how many tokens end at
/// position `len - 1 - k` as they end at the end (`z[0]` is unused), in one
/// linear pass (Gusfield's Z-algorithm on the reversed sequence).
fn reverse_z(window: &[TokenId], z: &mut Vec<u32>) {
    let n = window.len();
    let at = |i: usize| window[n - 1 - i];
    z.clear();
    z.resize(n, 0);
    // [left, right) is the rightmost match found so far: at(left..right)
    // equals at(0..right - left).
    let (mut left, mut right) = (0, 0);
    for k in 1..n {
        let mut length = 0;
        if k < right {
            length = (z[k - left] as usize).min(right - k);
        }
        if k + length >= right {
            while k + length < n && at(length) == at(k + length) {
                length += 1;
            }
            if length > 0 {
                (left, right) = (k, k + length);
            }
        }
        // A window longer than u32::MAX tokens is cut before this.
        z[k] = length as u32;
    }
}

impl LogitTransform for Dry {
    /// Penalises, in `logits`, the tokens that would extend a repeat of the
    /// window (see the module doc). One pass over the window for the
    /// breakers and one for the Z-array; nothing is allocated once the
    /// scratch is as long as the window.
    fn apply(&self, logits: &mut [f32], history: &History<'_>) {
        let n_window = match self.penalty_last_n {
            Some(n) => n,
            None => history.tokens.len(),
        };
        let n_window = n_window.min(history.tokens.len()).min(u32::MAX as usize);
        if self.multiplier == 0.0 || n_window <= self.allowed_length {
            return;
        }
        let window = &history.tokens[history.tokens.len() - n_window..];
        let limit = self.breakers.repeat_limit(window);
        if limit < self.allowed_length {
            return;
        }
        let mut guard = self.scratch.try_lock().ok();
        let mut own = Scratch::default();
        let scratch = guard.as_deref_mut().unwrap_or(&mut own);
        self.longest_repeats(window, limit, scratch);
        for (&id, &repeat) in &scratch.longest {
            if self.breakers.is_whole(id) {
                continue;
            }
            if let Some(z) = logits.get_mut(id as usize) {
                *z -= self.penalty(repeat);
            }
        }
    }
}

impl Clone for Dry {
    fn clone(&self) -> Self {
        Self {
            breakers: Arc::clone(&self.breakers),
            scratch: Mutex::default(),
            ..*self
        }
    }
}

impl fmt::Debug for Dry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dry")
            .field("multiplier", &self.multiplier)
            .field("base", &self.base)
            .field("allowed_length", &self.allowed_length)
            .field("penalty_last_n", &self.penalty_last_n)
            .field("breakers", &self.breakers.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::TokenCounts;
    use proptest::prelude::*;

    /// A vocabulary of texts, one a token.
    struct Texts(Vec<String>);

    impl Detokenize for Texts {
        fn decode(&self, ids: &[TokenId]) -> String {
            ids.iter().map(|&id| self.0[id as usize].as_str()).collect()
        }
    }

    /// Ten tokens: letters, a newline, a colon, and the pieces of "##" and
    /// "->" (a split breaker: "a-" then ">").
    fn toy() -> Texts {
        let texts = ["a", "b", "c", "d", "\n", ":", "#", "##", "a-", ">"];
        Texts(texts.iter().map(|t| t.to_string()).collect())
    }

    fn strings(breakers: &[&str]) -> Vec<String> {
        breakers.iter().map(|b| b.to_string()).collect()
    }

    /// The penalties by brute force, in the module doc's terms: for each
    /// token `t`, the longest `n <= L` such that the last `n` tokens of the
    /// window also end at some `j` followed by `t`, then the same f64
    /// penalty. Breakers by text: a position breaks when its token's text
    /// holds a breaker, or ends with the start of a breaker it does not hold
    /// that the next tokens' texts complete exactly.
    fn brute_force(
        texts: &Texts,
        breakers: &[&str],
        settings: (f32, f32, usize),
        window: &[TokenId],
        logits: &[f32],
    ) -> Vec<f32> {
        let (multiplier, base, allowed) = settings;
        let text = |id: TokenId| texts.0[id as usize].clone();
        let n = window.len();
        let mut out = logits.to_vec();
        if multiplier == 0.0 || n <= allowed {
            return out;
        }
        // Whether a breaker starts at position p and ends at position e.
        let breaks_at = |p: usize| -> Option<usize> {
            let head = text(window[p]);
            let mut best = breakers.iter().any(|b| head.contains(b)).then_some(p);
            // As llama.cpp: a token that holds a breaker whole starts none
            // of that breaker's rests.
            for b in breakers.iter().filter(|b| !head.contains(*b)) {
                for k in 1..b.len() {
                    if !head.ends_with(&b[..k]) {
                        continue;
                    }
                    let mut spelled = String::new();
                    for (e, &id) in window.iter().enumerate().skip(p + 1) {
                        spelled.push_str(&text(id));
                        if spelled == b[k..] {
                            best = best.max(Some(e));
                        }
                        if spelled.len() >= b[k..].len() {
                            break;
                        }
                    }
                }
            }
            best
        };
        let limit = (0..n)
            .rev()
            .find_map(|p| breaks_at(p).map(|end| n - 1 - end))
            .unwrap_or(n);
        if limit < allowed {
            return out;
        }
        let mut longest: HashMap<TokenId, usize> = HashMap::new();
        for j in 0..n - 1 {
            let mut repeat = 0;
            while repeat <= j && window[j - repeat] == window[n - 1 - repeat] {
                repeat += 1;
            }
            let repeat = repeat.min(limit);
            if repeat >= allowed {
                let entry = longest.entry(window[j + 1]).or_insert(repeat);
                *entry = (*entry).max(repeat);
            }
        }
        let max_exponent = if base > 1.000_001 {
            (88.722_84f32 / base.ln()) as usize
        } else {
            0
        };
        for (id, repeat) in longest {
            if breakers.iter().any(|b| text(id).contains(b)) {
                continue;
            }
            let mut exponent = repeat - allowed;
            if max_exponent > 0 {
                exponent = exponent.min(max_exponent);
            }
            let penalty = f64::from(multiplier) * f64::from(base).powf(exponent as f64);
            out[id as usize] -= penalty as f32;
        }
        out
    }

    fn apply(dry: &Dry, history: &[TokenId], logits: &[f32]) -> Vec<f32> {
        let mut out = logits.to_vec();
        dry.apply(&mut out, &History::new(history, &TokenCounts::default()));
        out
    }

    #[test]
    fn the_z_array_is_the_longest_common_suffix() {
        // llama.cpp's example: a b c c b c y a b c.
        let window = [0, 1, 2, 2, 1, 2, 6, 0, 1, 2];
        let mut z = Vec::new();
        reverse_z(&window, &mut z);
        // Read forwards (position j = 9 - k): 0 0 3 1 0 2 0 0 0 (0 unused).
        let forwards: Vec<u32> = (1..10).rev().map(|k| z[k]).collect();
        assert_eq!(forwards, [0, 0, 3, 1, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn llama_cpps_example_penalises_the_tokens_that_extend_each_repeat() {
        // a b c c b c y a b c: "a b c" then c (3), "c" then b (1), "b c"
        // then y (2). With allowed_length 2: c gets 1 * 2^1, y 1 * 2^0.
        let dry = Dry::new(1.0, 2.0, 2, None, Arc::new(SequenceBreakers::none())).unwrap();
        let out = apply(&dry, &[0, 1, 2, 2, 1, 2, 6, 0, 1, 2], &[0.0; 8]);
        assert_eq!(out, [0.0, 0.0, -2.0, 0.0, 0.0, 0.0, -1.0, 0.0]);
    }

    #[test]
    fn a_breaker_stops_the_repeat_and_is_never_penalised() {
        let texts = toy();
        let breakers = Arc::new(SequenceBreakers::new(&strings(&["\n"]), 10, &texts).unwrap());
        let dry = Dry::new(1.0, 2.0, 1, None, Arc::clone(&breakers)).unwrap();
        // a b \n a b \n a b: every repeat of the last tokens is followed by
        // "\n", a breaker, which is never penalised.
        let out = apply(&dry, &[0, 1, 4, 0, 1, 4, 0, 1], &[0.0; 10]);
        assert_eq!(out, [0.0; 10]);
        // a b c \n a b c \n a b: c would extend "a b" only (2 tokens after
        // the last breaker, not 6): 2^(2 - 1).
        let out = apply(&dry, &[0, 1, 2, 4, 0, 1, 2, 4, 0, 1], &[0.0; 10]);
        assert_eq!(out[2], -2.0);
    }

    #[test]
    fn a_breaker_split_across_tokens_is_matched_by_text() {
        let texts = toy();
        let breakers = Arc::new(SequenceBreakers::new(&strings(&["->"]), 10, &texts).unwrap());
        let dry = Dry::new(1.0, 2.0, 1, None, breakers).unwrap();
        // c a- > b c a- > b: c would extend "c a- > b" (4 tokens), but
        // "a-" then ">" spells "->", so only "b" counts: 2^(1 - 1).
        let history = [2, 8, 9, 1, 2, 8, 9, 1];
        assert_eq!(apply(&dry, &history, &[0.0; 10])[2], -1.0);
        let plain = Dry::new(1.0, 2.0, 1, None, Arc::new(SequenceBreakers::none())).unwrap();
        assert_eq!(apply(&plain, &history, &[0.0; 10])[2], -8.0);
        // c a- b c a- b: "a-" then "b" spells no breaker, so c would extend
        // all of "c a- b": 2^(3 - 1).
        let history = [2, 8, 1, 2, 8, 1];
        assert_eq!(apply(&dry, &history, &[0.0; 10])[2], -4.0);
    }

    #[test]
    fn a_token_holding_a_breaker_starts_no_rest_of_it() {
        // # a ## #: "##" holds the breaker "##", so its trailing "#" does not
        // start another "##" with the last "#". The repeat limit is 1, and
        // "#" then "a" earns "a" 0.8 * 1^0. llama.cpp 0.3.36 on SmolLM2's
        // vocabulary (ids 19, 81, 712, 19; breakers "##", "->") changes
        // exactly that logit, by -0.8.
        let breakers =
            Arc::new(SequenceBreakers::new(&strings(&["##", "->"]), 10, &toy()).unwrap());
        let dry = Dry::new(0.8, 1.0, 1, None, breakers).unwrap();
        let out = apply(&dry, &[6, 0, 7, 6], &[0.0; 10]);
        assert_eq!(out, [-0.8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn the_exponent_is_capped_as_llama_cpp_caps_it() {
        // base 2: 88.72284 / ln 2 = 128.0; a loop of 300 tokens repeats 298.
        let dry = Dry::new(1.0, 2.0, 1, None, Arc::new(SequenceBreakers::none())).unwrap();
        assert_eq!(dry.max_exponent, 128);
        let out = apply(&dry, &[3; 300], &[0.0; 4]);
        assert_eq!(out[3], -(2f64.powi(128) as f32));
        // 1.5 * 2^128 overflows f32: the logit goes to -inf, as in llama.cpp.
        let dry = Dry::new(1.5, 2.0, 1, None, Arc::new(SequenceBreakers::none())).unwrap();
        assert_eq!(apply(&dry, &[3; 300], &[0.0; 4])[3], f32::NEG_INFINITY);
    }

    #[test]
    fn off_settings_and_short_windows_change_nothing() {
        let none = || Arc::new(SequenceBreakers::none());
        let history = [0, 1, 0, 1, 0, 1];
        for dry in [
            Dry::new(0.0, 2.0, 1, None, none()).unwrap(),
            Dry::new(1.0, 2.0, 1, Some(0), none()).unwrap(),
            Dry::new(1.0, 2.0, 6, None, none()).unwrap(),
            Dry::new(1.0, 2.0, 2, Some(2), none()).unwrap(),
        ] {
            assert_eq!(apply(&dry, &history, &[0.0; 2]), [0.0; 2], "{dry:?}");
        }
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let none = || Arc::new(SequenceBreakers::none());
        for multiplier in [-0.1, f32::NAN, f32::INFINITY] {
            let err = Dry::new(multiplier, 1.75, 2, None, none()).unwrap_err();
            assert!(matches!(err, Error::InvalidDryMultiplier { .. }), "{err}");
        }
        for base in [0.99, f32::NAN, f32::INFINITY] {
            let err = Dry::new(0.8, base, 2, None, none()).unwrap_err();
            assert!(matches!(err, Error::InvalidDryBase { .. }), "{err}");
        }
        let err = SequenceBreakers::new(&strings(&["a", ""]), 10, &toy()).unwrap_err();
        assert_eq!(err, Error::EmptyDryBreaker { index: 1 });
    }

    #[test]
    fn debug_shows_the_settings_not_the_table() {
        let breakers =
            SequenceBreakers::new(&strings(&SequenceBreakers::DEFAULT), 10, &toy()).unwrap();
        assert_eq!(breakers.len(), 4);
        let dry = Dry::new(0.8, 1.75, 2, Some(64), Arc::new(breakers)).unwrap();
        assert_eq!(
            format!("{dry:?}"),
            "Dry { multiplier: 0.8, base: 1.75, allowed_length: 2, penalty_last_n: Some(64), breakers: 4 }"
        );
    }

    proptest! {
        #[test]
        fn the_penalties_match_brute_force(
            history in prop::collection::vec(0u32..10, 0..60),
            multiplier in prop::sample::select(vec![0.0f32, 0.8, 1.5]),
            base in prop::sample::select(vec![1.0f32, 1.75, 2.0]),
            allowed in 0usize..5,
            last_n in prop::option::of(0usize..70),
            set in 0usize..4,
        ) {
            let sets: [&[&str]; 4] = [&[], &["\n", ":"], &["##", "->"], &["\n", ":", "\"", "*", "a-b", "###"]];
            let texts = toy();
            let breakers = Arc::new(SequenceBreakers::new(&strings(sets[set]), 10, &texts).unwrap());
            let dry = Dry::new(multiplier, base, allowed, last_n, breakers).unwrap();
            let logits: Vec<f32> = (0..10).map(|i| i as f32 * 0.5 - 2.0).collect();
            let n = last_n.unwrap_or(history.len()).min(history.len());
            let window = &history[history.len() - n..];
            let want = brute_force(&texts, sets[set], (multiplier, base, allowed), window, &logits);
            prop_assert_eq!(apply(&dry, &history, &logits), want);
        }

        #[test]
        fn loops_of_few_tokens_match_brute_force(
            period in prop::collection::vec(0u32..4, 1..4),
            repeats in 1usize..40,
            allowed in 0usize..4,
        ) {
            let history: Vec<TokenId> = period.iter().copied().cycle().take(period.len() * repeats).collect();
            let texts = toy();
            let dry = Dry::new(0.8, 1.75, allowed, None, Arc::new(SequenceBreakers::none())).unwrap();
            let logits = [1.0f32; 10];
            let want = brute_force(&texts, &[], (0.8, 1.75, allowed), &history, &logits);
            prop_assert_eq!(apply(&dry, &history, &logits), want);
        }
    }
}
