//! lm-decode's DRY against llama.cpp's (`fixtures/samplers/dry.json`, written
//! by `scripts/reference/dry_reference.py`): for every case, a history of
//! SmolLM2 tokens, one setting and SmolLM2's 49,152-entry logits row, `Dry`
//! must change exactly the ids llama.cpp changed, to the same logits.
//!
//! The cases without breakers need no model; the others compile the
//! breakers over SmolLM2's vocabulary (`#[ignore]`d until it is fetched).
//! The new logits agree within 1e-4 relative (both sides compute
//! `multiplier * base^e` in f64 with the C library's `pow` and round it to
//! f32, so they are expected to be equal).

use std::sync::Arc;

use lm::lm_core::{Detokenize, TokenId};
use lm::lm_decode::sampler::{Dry, History, LogitTransform, SequenceBreakers, TokenCounts};
use serde::Deserialize;

use crate::common;

#[derive(Deserialize)]
struct Fixture {
    row: String,
    breaker_sets: std::collections::BTreeMap<String, Vec<String>>,
    breaker_tokens: std::collections::BTreeMap<String, Vec<TokenId>>,
    histories: Vec<HistoryCase>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct HistoryCase {
    name: String,
    ids: Vec<TokenId>,
}

#[derive(Deserialize)]
struct Case {
    history: String,
    multiplier: f32,
    base: f32,
    allowed_length: usize,
    penalty_last_n: i64,
    breakers: String,
    n_changed: usize,
    /// `(id, new logit)`, by id; `None` is -inf.
    changed: Vec<(TokenId, Option<f32>)>,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "{} (multiplier {}, base {}, allowed {}, last_n {}, breakers {})",
            self.history,
            self.multiplier,
            self.base,
            self.allowed_length,
            self.penalty_last_n,
            self.breakers
        )
    }
}

fn fixture() -> Fixture {
    common::fixture_json("samplers/dry.json")
}

fn logits_row(fixture: &Fixture) -> Vec<f32> {
    let relative = fixture.row.trim_start_matches("fixtures/");
    common::read_f32le(&common::fixture_path(relative))
}

/// The ids `dry` changes in `row` after `history`, with their new logits.
fn changes(dry: &Dry, history: &[TokenId], row: &[f32]) -> Vec<(TokenId, f32)> {
    let mut logits = row.to_vec();
    dry.apply(&mut logits, &History::new(history, &TokenCounts::default()));
    (0..)
        .zip(logits.iter().zip(row))
        .filter(|(_, (new, old))| new != old)
        .map(|(id, (&new, _))| (id, new))
        .collect()
}

/// Checks every case whose breaker set `breakers` can compile; returns how
/// many it checked.
fn check_cases(
    fixture: &Fixture,
    breakers: &dyn Fn(&str) -> Option<Arc<SequenceBreakers>>,
) -> usize {
    let row = logits_row(fixture);
    let mut failures = Vec::new();
    let mut n_checked = 0;
    for case in &fixture.cases {
        let Some(table) = breakers(&case.breakers) else {
            continue;
        };
        let history = &fixture
            .histories
            .iter()
            .find(|h| h.name == case.history)
            .expect("the case's history")
            .ids;
        assert_eq!(case.changed.len(), case.n_changed, "{}", case.name());
        // llama-cpp-python 0.3.36's llama.cpp reads -1 as 0 (off).
        let last_n = usize::try_from(case.penalty_last_n).unwrap_or(0);
        let mut windows = vec![Some(last_n)];
        if last_n >= history.len() {
            // A window longer than the history is the whole history.
            windows.push(None);
        }
        for window in windows {
            let dry = Dry::new(
                case.multiplier,
                case.base,
                case.allowed_length,
                window,
                Arc::clone(&table),
            )
            .expect("the fixture's settings are valid");
            let ours = changes(&dry, history, &row);
            if let Some(why) = mismatch(&ours, &case.changed) {
                failures.push(format!("{} as {window:?}: {why}", case.name()));
            }
        }
        n_checked += 1;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    n_checked
}

fn mismatch(ours: &[(TokenId, f32)], want: &[(TokenId, Option<f32>)]) -> Option<String> {
    let our_ids: Vec<TokenId> = ours.iter().map(|&(id, _)| id).collect();
    let want_ids: Vec<TokenId> = want.iter().map(|&(id, _)| id).collect();
    if our_ids != want_ids {
        return Some(format!("changed ids {our_ids:?}, llama.cpp {want_ids:?}"));
    }
    for (&(id, z), &(_, expected)) in ours.iter().zip(want) {
        let expected = expected.unwrap_or(f32::NEG_INFINITY);
        let close = z == expected || (z - expected).abs() <= 1e-4 * expected.abs();
        if !close {
            return Some(format!("token {id}: {z}, llama.cpp {expected}"));
        }
    }
    None
}

#[test]
fn dry_without_breakers_changes_what_llama_cpp_changes() {
    let fixture = fixture();
    let none = Arc::new(SequenceBreakers::none());
    let n = check_cases(&fixture, &|set| (set == "none").then(|| Arc::clone(&none)));
    assert!(n >= 15, "{n} cases");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn dry_with_breakers_over_smollm2_changes_what_llama_cpp_changes() {
    let fixture = fixture();
    let model = common::smollm2();
    let tokenizer = &model.text.tokenizer;
    let vocab_size = tokenizer.vocab_size();
    assert_eq!(vocab_size, 49_152);
    // The detokenizer reads each token as llama.cpp does, for the breakers.
    for (set, want) in &fixture.breaker_tokens {
        let breakers = &fixture.breaker_sets[set];
        let ours: Vec<TokenId> = (0..vocab_size as TokenId)
            .filter(|&id| {
                let text = Detokenize::decode(tokenizer, &[id]);
                breakers.iter().any(|b| text.contains(b.as_str()))
            })
            .collect();
        assert_eq!(&ours, want, "tokens holding a breaker of {set:?}");
    }
    let tables: Vec<(String, Arc<SequenceBreakers>)> = fixture
        .breaker_sets
        .iter()
        .map(|(name, breakers)| {
            let table = SequenceBreakers::new(breakers, vocab_size, tokenizer)
                .expect("the fixture's breakers compile");
            assert_eq!(table.len(), breakers.len());
            (name.clone(), Arc::new(table))
        })
        .collect();
    let n = check_cases(&fixture, &|set| {
        tables
            .iter()
            .find(|(name, _)| name == set)
            .map(|(_, table)| Arc::clone(table))
    });
    assert_eq!(n, fixture.cases.len());
    assert!(n >= 60, "{n} cases");
}
