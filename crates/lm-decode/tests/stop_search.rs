//! Stop rules. The incremental stop-string search against the whole-text search it
//! replaces: after every id, the same stop position, string and text as
//! [`find_stop_string`] on the whole decoded text, for stop strings that
//! span several tokens and tokens that hold half a UTF-8 character; and a
//! `max_new_tokens` far beyond memory that only a stop rule ends. The
//! hold-back rule of streamed text ([`TextDeltas`]) on its edge cases and
//! against the whole-text cut: the pieces handed out always start the
//! final text and join to it.

use lm_core::{Detokenize, TokenId};
use lm_decode::{IncrementalText, StopSearch, TextDeltas, find_stop_string};
use proptest::prelude::*;

/// Byte-level tokens: the concatenated bytes, invalid UTF-8 replaced (as a
/// byte-level BPE decodes). "é" is C3 A9 and "🙂" F0 9F 99 82, each also
/// split over two tokens.
struct Bytes;

const PIECES: [&[u8]; 12] = [
    b"a",
    b"b",
    b"ab",
    b" ",
    b"\n",
    b"xyz",
    &[0xC3],
    &[0xA9],
    "é".as_bytes(),
    &[0xF0, 0x9F],
    &[0x99, 0x82],
    "🙂".as_bytes(),
];

impl Detokenize for Bytes {
    fn decode(&self, ids: &[TokenId]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| PIECES[id as usize].iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Words joined by single spaces (as the toy and word models write them):
/// the text after a context starts with the space of the seam.
struct Words;

impl Detokenize for Words {
    fn decode(&self, ids: &[TokenId]) -> String {
        ids.iter()
            .map(|&id| ["the", "cat", "sat", "é", "on"][id as usize % 5])
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The text the whole-text way: decode everything, strip the decoded context.
fn whole(detokenizer: &dyn Detokenize, context: &[TokenId], ids: &[TokenId]) -> String {
    let all: Vec<TokenId> = context.iter().chain(ids).copied().collect();
    let full = detokenizer.decode(&all);
    let base = detokenizer.decode(context);
    full.strip_prefix(base.as_str())
        .map_or_else(|| detokenizer.decode(ids), str::to_owned)
}

/// The first stop: after how many ids, at which byte, which stop string.
type FirstStop = (usize, usize, usize);

/// Pushes `ids` one at a time and compares each step with the whole-text
/// search; returns the step and match of the first stop (both ways agree).
fn check(
    detokenizer: &dyn Detokenize,
    context: &[TokenId],
    ids: &[TokenId],
    stops: &[String],
) -> Option<FirstStop> {
    let mut search = StopSearch::new(detokenizer, stops, context);
    for k in 1..=ids.len() {
        let found = search.push(ids[k - 1]);
        let text = whole(detokenizer, context, &ids[..k]);
        assert_eq!(search.text().text(), text, "text after {k} ids {ids:?}");
        assert_eq!(search.text().len(), text.len());
        let expected = find_stop_string(&text, stops);
        assert_eq!(found, expected, "after {k} ids {ids:?}, stops {stops:?}");
        if let Some((byte, index)) = found {
            assert_eq!(search.text_before_stop(), text[..byte]);
            return Some((k, byte, index));
        }
    }
    assert_eq!(search.text_before_stop(), whole(detokenizer, context, ids));
    None
}

#[test]
fn stop_strings_spanning_tokens_and_split_characters_are_found_where_the_whole_text_finds_them() {
    let stops = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // "a" "b" | "é" from C3 + A9 | "🙂" from F0 9F + 99 82
    let ids: [TokenId; 8] = [0, 1, 6, 7, 3, 9, 10, 0];
    let cases: [(&[&str], Option<FirstStop>); 7] = [
        (&["bé"], Some((4, 1, 0))),       // spans "b" and both halves of "é"
        (&["é 🙂a"], Some((8, 2, 0))),    // spans five tokens
        (&["🙂"], Some((7, 5, 0))),       // found only once its second half arrives
        (&["\u{FFFD}"], Some((3, 2, 0))), // the whole text shows half a character as U+FFFD
        (&["zz", "b"], Some((2, 1, 1))),
        (&["ab", "a"], Some((1, 0, 1))),
        (&["q"], None),
    ];
    for (list, expected) in cases {
        assert_eq!(check(&Bytes, &[], &ids, &stops(list)), expected, "{list:?}");
    }
    // With a context: the seam's space belongs to the text.
    assert_eq!(
        check(&Words, &[0, 1], &[2, 3, 4], &stops(&[" sat é"])),
        Some((2, 0, 0))
    );
}

#[test]
fn incremental_text_equals_the_whole_decode_at_every_step() {
    let mut text = IncrementalText::new(&Bytes, &[]);
    let ids: [TokenId; 6] = [9, 10, 6, 0, 7, 11];
    for k in 1..=ids.len() {
        text.push(ids[k - 1]);
        assert_eq!(text.text(), Bytes.decode(&ids[..k]), "after {k}");
    }
    assert!(!text.is_empty());
}

proptest! {
    #[test]
    fn the_tail_search_agrees_with_the_whole_text_search(
        ids in proptest::collection::vec(0..PIECES.len() as TokenId, 0..40),
        context in proptest::collection::vec(0..5 as TokenId, 0..3),
        words in any::<bool>(),
        cuts in proptest::collection::vec((0usize..200, 1usize..6), 1..4),
        literal in "[ab é🙂\u{FFFD}]{1,3}",
    ) {
        let detokenizer: &dyn Detokenize = if words { &Words } else { &Bytes };
        let context: &[TokenId] = if words { &context } else { &[] };
        // Stop strings cut from the final text (so most runs stop), plus one literal.
        let mut stops = cut_from(&whole(detokenizer, context, &ids), &cuts);
        stops.push(literal);
        check(detokenizer, context, &ids, &stops);
    }
}

/// Stop strings cut from `text`, each `(start, len)` in characters
/// (`start` taken modulo the length).
fn cut_from(text: &str, cuts: &[(usize, usize)]) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    cuts.iter()
        .map(|&(start, len)| {
            let start = start % chars.len();
            let end = (start + len).min(chars.len());
            chars[start..end].iter().collect()
        })
        .collect()
}

/// Streams `ids` through [`TextDeltas`] (`end` an end token) and checks
/// every piece against the whole-text way: what has been handed out after
/// each id starts the final text (the whole decode cut before the first
/// stop string), and with `finish` the pieces join to it. Returns the
/// pieces, `finish`'s last.
fn check_deltas(
    detokenizer: &dyn Detokenize,
    context: &[TokenId],
    ids: &[TokenId],
    end: &[TokenId],
    stops: &[String],
) -> Vec<String> {
    // The final text: decode up to the end token or the first stop.
    let mut text_ids: Vec<TokenId> = Vec::new();
    let mut expected = whole(detokenizer, context, &text_ids);
    for &id in ids {
        if end.contains(&id) {
            continue;
        }
        text_ids.push(id);
        let text = whole(detokenizer, context, &text_ids);
        if let Some((byte, _)) = find_stop_string(&text, stops) {
            expected = text[..byte].to_owned();
            break;
        }
        expected = text;
    }
    let mut deltas = TextDeltas::new(detokenizer, context, end, stops);
    let mut pieces = Vec::new();
    let mut shown = String::new();
    for (k, &id) in ids.iter().enumerate() {
        deltas.push(id);
        let piece = deltas.take_final();
        shown.push_str(&piece);
        pieces.push(piece);
        assert!(
            expected.starts_with(&shown),
            "after {} ids {ids:?}: {shown:?} does not start {expected:?}",
            k + 1
        );
    }
    assert_eq!(deltas.text(), expected);
    let rest = deltas.finish();
    shown.push_str(&rest);
    pieces.push(rest);
    assert_eq!(shown, expected, "ids {ids:?}, stops {stops:?}");
    assert_eq!(deltas.finish(), "", "finish hands the rest out once");
    pieces
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_stop_string_split_across_tokens_is_held_back_then_cut() {
    // "a" "b" "ab": "bab" spans all three; "a" is shown only once the stop
    // string is found, and nothing of it.
    let pieces = check_deltas(&Bytes, &[], &[0, 1, 2, 0], &[], &strings(&["bab"]));
    assert_eq!(pieces, ["", "", "a", "", ""]);
    // "ab" " " "xyz" against "b xz": "b x" almost matches; the last 3 bytes
    // are held whatever they are, so "ab " goes out once "xyz" arrives and
    // "xyz" at the end.
    let pieces = check_deltas(&Bytes, &[], &[2, 3, 5], &[], &strings(&["b xz"]));
    assert_eq!(pieces, ["", "", "ab ", "xyz"]);
}

#[test]
fn a_character_split_across_tokens_is_shown_once_whole() {
    // "a" | F0 9F | 99 82 | C3 | A9: "🙂" and "é" each arrive in halves.
    let pieces = check_deltas(&Bytes, &[], &[0, 9, 10, 6, 7], &[], &[]);
    assert_eq!(pieces, ["a", "", "🙂", "", "é", ""]);
    // With one byte held back for a stop string as well: the cut never
    // splits "é" (2 bytes), it moves back to the character's start.
    let pieces = check_deltas(&Bytes, &[], &[8, 8, 0, 1], &[], &strings(&["qq"]));
    assert_eq!(pieces, ["", "é", "é", "a", "b"]);
    // The held-back bytes count from the end of the settled text: "éé"
    // then C3 decodes as "éé\u{FFFD}" (7 bytes), but the FFFD becomes "é"
    // (2 bytes) and completes the stop string "ééé", so nothing is final
    // before it.
    let pieces = check_deltas(&Bytes, &[], &[8, 8, 6, 7], &[], &strings(&["ééé"]));
    assert_eq!(pieces, ["", "", "", "", ""]);
}

#[test]
fn after_a_stop_string_nothing_more_is_shown_and_end_tokens_never() {
    // Token 4 ("\n") is the end token here; it adds no text, and "b"
    // after the stop "ab" adds nothing either.
    let pieces = check_deltas(&Bytes, &[], &[0, 4, 1, 1, 0], &[4], &strings(&["ab"]));
    assert_eq!(pieces, ["", "", "", "", "", ""]);
    let pieces = check_deltas(&Bytes, &[], &[5, 4, 5], &[4], &[]);
    assert_eq!(pieces, ["xyz", "", "xyz", ""]);
}

#[test]
fn the_end_of_the_stream_flushes_the_held_text() {
    // "xyz" could start "xyz!" to the end: all of it is held, and finish
    // hands it out.
    let pieces = check_deltas(&Bytes, &[], &[5], &[], &strings(&["xyz!"]));
    assert_eq!(pieces, ["", "xyz"]);
    // A trailing half character too (the whole decode ends in U+FFFD).
    let pieces = check_deltas(&Bytes, &[], &[0, 9], &[], &[]);
    assert_eq!(pieces, ["a", "", "\u{FFFD}"]);
}

proptest! {
    // A released byte too many needs a stop string of the longest length
    // that ends in a character split over two tokens: rare, so many cases.
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]
    #[test]
    fn streamed_pieces_start_and_join_to_the_whole_text_cut_at_the_stop(
        ids in proptest::collection::vec(0..PIECES.len() as TokenId, 0..40),
        context in proptest::collection::vec(0..5 as TokenId, 0..3),
        words in any::<bool>(),
        end in proptest::option::of(0..PIECES.len() as TokenId),
        cuts in proptest::collection::vec((0usize..200, 1usize..6), 0..3),
        literals in proptest::collection::vec("[ab é🙂x\n]{1,4}", 0..2),
    ) {
        let detokenizer: &dyn Detokenize = if words { &Words } else { &Bytes };
        let context: &[TokenId] = if words { &context } else { &[] };
        let end: Vec<TokenId> = end.into_iter().collect();
        // Stop strings cut from the whole text (so many runs stop, some
        // just after a split character), plus literals.
        let mut stops = cut_from(&whole(detokenizer, context, &ids), &cuts);
        stops.extend(literals);
        check_deltas(detokenizer, context, &ids, &end, &stops);
    }
}

#[test]
fn a_huge_max_new_tokens_runs_until_a_stop_rule_without_reserving_for_it() {
    use crate::common::TableModel;
    use lm_decode::{GenerationConfig, SamplingConfig, StopReason, generate};
    // 0 -> 1 -> 2 -> 3 -> 3 ...: "a" "b" "ab" " " ...; no context bound.
    let row = |next: usize| (0..4).map(|i| if i == next { 5.0 } else { 0.0 }).collect();
    let model = TableModel {
        table: vec![row(1), row(2), row(3), row(3)],
        context_length: None,
    };
    let config = GenerationConfig {
        max_new_tokens: usize::MAX - 1,
        sampling: SamplingConfig::greedy(),
        stop_strings: vec!["bab".into()],
        ..GenerationConfig::default()
    };
    let run = generate(&model, &[0], &config, Some(&Bytes)).unwrap();
    assert_eq!(run.tokens, vec![1, 2]);
    assert_eq!(run.stop_reason, StopReason::StopString("bab".into()));
    assert_eq!(run.text.as_deref(), Some(""));
}
