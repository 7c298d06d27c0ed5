//! SentencePiece tokenizers built from a small hand-made vocabulary with
//! scores and byte fallback; every expected id list is worked out by hand
//! from llama.cpp's rule (merge the adjacent pair whose text is the
//! highest-scoring token, the leftmost on a tie; bytes for what is left).

use lm_tokenize::{SpmVocab, TextPart, TokenizeError, Tokenizer};

/// The vocabulary, one `(text, score, type)` per id (types: 1 normal,
/// 2 unknown, 3 control, 4 user-defined, 6 byte).
const TOKENS: &[(&str, f32, i32)] = &[
    ("<unk>", 0.0, 2),  // 0
    ("<s>", 0.0, 3),    // 1
    ("</s>", 0.0, 3),   // 2
    ("<0x0A>", 0.0, 6), // 3
    ("<0xC3>", 0.0, 6), // 4
    ("<0xA9>", 0.0, 6), // 5
    ("▁", -1.0, 1),     // 6
    ("a", -2.0, 1),     // 7
    ("b", -2.0, 1),     // 8
    ("c", -2.0, 1),     // 9
    ("ab", -5.0, 1),    // 10
    ("bc", -3.0, 1),    // 11
    ("▁a", -4.0, 1),    // 12
    ("aa", -2.5, 1),    // 13
    ("<tool>", 0.0, 4), // 14
    ("cab", -0.5, 1),   // 15
];

/// The vocabulary above with `<s>` as bos, `</s>` as eos and `<unk>`, adding
/// neither; `add_space_prefix` as given.
fn vocab(add_space_prefix: bool) -> SpmVocab {
    SpmVocab {
        tokens: TOKENS.iter().map(|t| t.0.to_owned()).collect(),
        scores: TOKENS.iter().map(|t| t.1).collect(),
        token_types: TOKENS.iter().map(|t| t.2).collect(),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        add_space_prefix,
        ..SpmVocab::default()
    }
}

fn spm(add_space_prefix: bool) -> Tokenizer {
    Tokenizer::from_spm_vocab(vocab(add_space_prefix)).unwrap()
}

fn check(tokenizer: &Tokenizer, text: &str, expected: &[u32]) {
    assert_eq!(tokenizer.encode(text).unwrap(), expected, "{text:?}");
}

#[test]
fn pairs_merge_by_score_not_by_position() {
    let tokenizer = spm(false);
    // a b c: "bc" (-3) beats "ab" (-5); then "a"+"bc" is no token.
    check(&tokenizer, "abc", &[7, 11]);
    // c a b: "cab" needs "ca" or "ab" first; "ab" (-5) is the only pair,
    // then "c"+"ab" = "cab" (-0.5).
    check(&tokenizer, "cab", &[15]);
    // a a a: both "aa" pairs score -2.5; the leftmost merges first.
    check(&tokenizer, "aaa", &[13, 7]);
}

#[test]
fn spaces_become_the_visible_space_and_the_prefix_is_added_once() {
    // "▁a▁b": "▁a" (-4) is the only pair that is a token.
    check(&spm(true), "a b", &[12, 6, 8]);
    // Without the prefix: "a▁b" has no pair that is a token.
    check(&spm(false), "a b", &[7, 6, 8]);
    check(&spm(true), "", &[]);
}

#[test]
fn characters_without_a_token_fall_back_to_bytes_then_to_unknown() {
    let tokenizer = spm(false);
    // é is C3 A9, both byte tokens; '\n' is <0x0A>.
    check(&tokenizer, "é\n", &[4, 5, 3]);
    // 'z' has neither a token nor a byte token.
    check(&tokenizer, "azb", &[7, 0, 8]);
    let no_unk = Tokenizer::from_spm_vocab(SpmVocab {
        unk_id: None,
        ..vocab(false)
    })
    .unwrap();
    assert!(matches!(
        no_unk.encode("z"),
        Err(TokenizeError::NoByteToken { byte: b'z' })
    ));
}

#[test]
fn special_tokens_are_matched_whole_and_text_after_them_gets_the_prefix() {
    let tokenizer = spm(true);
    // [<s>] "a" [<tool>] "b": each text follows a special token, so each
    // gets a space prefix: "▁a" -> 12, "▁b" -> 6 8.
    check(&tokenizer, "<s>a<tool>b", &[1, 12, 14, 6, 8]);
    // Literal text still matches user-defined tokens, never control ones:
    // "<s>" is spelled out ('<', 's', '>' have no token: unknown).
    assert_eq!(tokenizer.encode_literal("<tool>").unwrap(), [14]);
    assert_eq!(tokenizer.encode_literal("<s>").unwrap(), [6, 0, 0, 0]);
}

#[test]
fn bos_and_eos_are_added_when_the_vocabulary_asks() {
    let tokenizer = Tokenizer::from_spm_vocab(SpmVocab {
        add_bos: true,
        add_eos: true,
        ..vocab(true)
    })
    .unwrap();
    check(&tokenizer, "a", &[1, 12, 2]);
    check(&tokenizer, "", &[1, 2]);
    assert!(tokenizer.add_eos());
    assert_eq!(tokenizer.end_ids(), &[2]);
}

#[test]
fn decoding_reads_bytes_and_spaces_and_drops_the_prefix_space() {
    let tokenizer = spm(true);
    assert_eq!(tokenizer.decode(&[12, 6, 8]).unwrap(), "a b");
    assert_eq!(tokenizer.decode(&[4, 5, 3]).unwrap(), "é\n");
    // llama.cpp strips the space of the first piece only, even when that
    // piece is a control token left out.
    assert_eq!(tokenizer.decode(&[1, 12, 14]).unwrap(), "<s> a<tool>");
    assert_eq!(
        tokenizer.decode_skipping_special(&[1, 12, 14]).unwrap(),
        " a<tool>"
    );
    assert_eq!(spm(false).decode(&[6, 7]).unwrap(), " a");
    assert!(matches!(
        tokenizer.decode(&[16]),
        Err(TokenizeError::TokenOutOfRange { id: 16, .. })
    ));
}

#[test]
fn stream_waits_for_the_second_byte_of_a_character() {
    let tokenizer = spm(false);
    let mut stream = tokenizer.text_stream(false);
    assert_eq!(stream.push(7).unwrap().as_deref(), Some("a"));
    assert_eq!(stream.push(4).unwrap(), None);
    assert_eq!(stream.push(5).unwrap().as_deref(), Some("é"));
    assert_eq!(stream.push(6).unwrap(), Some(" ".to_owned()));
    assert_eq!(stream.finish().unwrap(), "");
}

#[test]
fn bad_vocabularies_are_typed_errors() {
    let err = |vocab| Tokenizer::from_spm_vocab(vocab).unwrap_err();
    assert!(matches!(
        err(SpmVocab {
            scores: vec![0.0; 3],
            ..vocab(false)
        }),
        TokenizeError::ScoreCountMismatch {
            n_tokens: 16,
            n_scores: 3
        }
    ));
    let mut bad_byte = vocab(false);
    bad_byte.tokens[3] = "<0xZZ>".into();
    assert!(matches!(
        err(bad_byte),
        TokenizeError::MalformedByteToken { id: 3, .. }
    ));
    let mut duplicate = vocab(false);
    duplicate.tokens[9] = "a".into();
    assert!(matches!(
        err(duplicate),
        TokenizeError::DuplicateToken {
            first_id: 7,
            second_id: 9,
            ..
        }
    ));
    assert!(matches!(
        err(SpmVocab::default()),
        TokenizeError::EmptyVocabulary
    ));
    assert!(matches!(
        err(SpmVocab {
            bos_id: Some(99),
            ..vocab(false)
        }),
        TokenizeError::SpecialTokenOutOfRange {
            role: "bos",
            id: 99,
            ..
        }
    ));
}

/// A vocabulary with all 256 byte tokens (ids 0..=255), a few merged
/// pieces, and the space prefix: every text is spelled, by pieces or bytes.
fn byte_complete_vocab() -> Tokenizer {
    let pieces = [
        "▁", "t", "h", "e", "th", "he", "the", "▁the", "é", "▁é", "🙂",
    ];
    let mut tokens: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
    let mut token_types = vec![6; 256];
    let mut scores = vec![0.0; 256];
    for (piece, idx) in pieces.iter().zip(0u8..) {
        tokens.push((*piece).to_owned());
        token_types.push(1);
        scores.push(-f32::from(idx));
    }
    Tokenizer::from_spm_vocab(SpmVocab {
        tokens,
        scores,
        token_types,
        add_space_prefix: true,
        ..SpmVocab::default()
    })
    .unwrap()
}

proptest::proptest! {
    #[test]
    fn decoding_inverts_encoding(text in "[the é🙂\u{4e00}-\u{4e05}\n\t]{0,24}") {
        let tokenizer = byte_complete_vocab();
        let ids = tokenizer.encode(&text).unwrap();
        proptest::prop_assert_eq!(tokenizer.decode(&ids).unwrap(), text.clone());
        // Streamed token by token, the same text, never half a character.
        let mut stream = tokenizer.text_stream(false);
        let mut streamed = String::new();
        for id in ids {
            if let Some(chunk) = stream.push(id).unwrap() {
                proptest::prop_assert!(!chunk.contains(char::REPLACEMENT_CHARACTER));
                streamed.push_str(&chunk);
            }
        }
        streamed.push_str(&stream.finish().unwrap());
        proptest::prop_assert_eq!(streamed, text);
    }
}

#[test]
fn the_byte_complete_vocabulary_merges_the_and_spells_the_rest_in_bytes() {
    let tokenizer = byte_complete_vocab();
    // "▁the▁x": "▁" 256, "the" 262, "▁the" 263; 'x' is byte 0x78.
    assert_eq!(tokenizer.encode("the x").unwrap(), [263, 256, 0x78]);
}

#[test]
fn a_text_in_parts_encodes_as_the_whole_text_with_literal_parts_kept_literal() {
    let parse = |text| TextPart {
        text,
        parse_special: true,
    };
    let tokenizer = spm(true);
    let whole = tokenizer.encode("<s>a<tool>b").unwrap();
    let parts = [parse("<s>a"), parse("<tool>b")];
    assert_eq!(tokenizer.encode_parts(&parts).unwrap(), whole);
    // A literal part spells control text out, with the space prefix a
    // whole text would give it after "<s>".
    let parts = [
        parse("<s>"),
        TextPart {
            text: "<s>",
            parse_special: false,
        },
    ];
    assert_eq!(tokenizer.encode_parts(&parts).unwrap(), [1, 6, 0, 0, 0]);
    // bos and eos once, around all the parts.
    let tokenizer = Tokenizer::from_spm_vocab(SpmVocab {
        add_bos: true,
        add_eos: true,
        ..vocab(true)
    })
    .unwrap();
    let parts = [parse("a"), parse("<tool>b")];
    assert_eq!(
        tokenizer.encode_parts(&parts).unwrap(),
        tokenizer.encode("a<tool>b").unwrap()
    );
}
