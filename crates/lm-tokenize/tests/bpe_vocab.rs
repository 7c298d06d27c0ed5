//! Tokenizers built from small hand-made vocabularies: merge order, special
//! tokens, streaming, and every kind of bad input as a typed error.

use lm_tokenize::{BpeVocab, TextPart, TokenizeError, Tokenizer, byte_level_char};
use proptest::prelude::*;
use std::sync::LazyLock;

/// A vocabulary of the 256 byte tokens (id = byte value) plus `extra` tokens
/// and `merges`, with the smollm pre-tokenizer.
fn byte_vocab(extra: &[(&str, i32)], merges: &[&str]) -> BpeVocab {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| byte_level_char(b).to_string())
        .collect();
    let mut token_types = vec![1; 256];
    for (text, token_type) in extra {
        tokens.push((*text).to_owned());
        token_types.push(*token_type);
    }
    BpeVocab {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types,
        merges: merges.iter().map(|m| (*m).to_owned()).collect(),
        ..BpeVocab::default()
    }
}

fn check(tokenizer: &Tokenizer, text: &str, expected: &[u32]) {
    assert_eq!(tokenizer.encode(text).unwrap(), expected, "{text:?}");
    assert_eq!(tokenizer.decode(expected).unwrap(), text);
}

#[test]
fn gpt2_byte_alphabet_has_the_known_space_and_newline() {
    assert_eq!(byte_level_char(b' '), 'Ġ');
    assert_eq!(byte_level_char(b'\n'), 'Ċ');
    assert_eq!(byte_level_char(b'\t'), 'ĉ');
}

#[test]
fn merges_apply_by_rank_not_by_position() {
    // Tokens 256.. : "ab", "bc", "abc". Ranks: "b c" first, then "a bc".
    // "abc": the pair (b, c) has the best rank, so a + bc, then abc.
    // With only "a b" ranked above "b c", "abc" would become ab + c.
    let tokenizer = Tokenizer::from_bpe_vocab(byte_vocab(
        &[("ab", 1), ("bc", 1), ("abc", 1)],
        &["b c", "a b", "a bc"],
    ))
    .unwrap();
    check(&tokenizer, "abc", &[258]);
    check(&tokenizer, "abx", &[256, u32::from(b'x')]);
    let reversed = Tokenizer::from_bpe_vocab(byte_vocab(
        &[("ab", 1), ("bc", 1), ("abc", 1)],
        &["a b", "b c", "a bc"],
    ))
    .unwrap();
    check(&reversed, "abc", &[256, u32::from(b'c')]);
}

#[test]
fn merges_never_cross_pre_tokenizer_pieces() {
    // "a1": smollm isolates the digit, so the merge "a 1" never applies.
    let tokenizer = Tokenizer::from_bpe_vocab(byte_vocab(&[("a1", 1)], &["a 1"])).unwrap();
    check(&tokenizer, "a1", &[u32::from(b'a'), u32::from(b'1')]);
}

#[test]
fn control_and_user_defined_tokens_match_whole() {
    // 256 <|im_start|> (control), 257 <tool> (user-defined).
    let tokenizer =
        Tokenizer::from_bpe_vocab(byte_vocab(&[("<|im_start|>", 3), ("<tool>", 4)], &[])).unwrap();
    let b = |c: u8| u32::from(c);
    check(&tokenizer, "<|im_start|>x<tool>", &[256, b(b'x'), 257]);
    // A near miss is plain text, byte by byte.
    check(
        &tokenizer,
        "<tool",
        &[b(b'<'), b(b't'), b(b'o'), b(b'o'), b(b'l')],
    );
    assert!(tokenizer.is_special(256));
    assert!(
        !tokenizer.is_special(257),
        "user-defined tokens are not special"
    );
    assert_eq!(
        tokenizer
            .decode_skipping_special(&[256, b(b'x'), 257])
            .unwrap(),
        "x<tool>"
    );
}

#[test]
fn add_bos_prepends_the_bos_token() {
    let mut vocab = byte_vocab(&[("<s>", 3)], &[]);
    vocab.bos_id = Some(256);
    vocab.add_bos = true;
    let tokenizer = Tokenizer::from_bpe_vocab(vocab).unwrap();
    assert_eq!(
        tokenizer.encode("hi").unwrap(),
        vec![256, u32::from(b'h'), u32::from(b'i')]
    );
    assert_eq!(tokenizer.encode("").unwrap(), vec![256]);
}

#[test]
fn stream_withholds_a_split_emoji_until_its_last_byte() {
    // 🙂 is F0 9F 99 82: token 256 holds its first three bytes, byte 0x82 the last.
    let first_three: String = [0xF0u8, 0x9F, 0x99]
        .iter()
        .map(|&b| byte_level_char(b))
        .collect();
    let mut vocab = byte_vocab(&[], &[]);
    vocab.tokens.push(first_three);
    vocab.token_types.push(1);
    let tokenizer = Tokenizer::from_bpe_vocab(vocab).unwrap();
    let mut stream = tokenizer.text_stream(false);
    assert_eq!(stream.push(u32::from(b'H')).unwrap().as_deref(), Some("H"));
    assert_eq!(stream.push(256).unwrap(), None);
    assert_eq!(stream.push(0x82).unwrap().as_deref(), Some("🙂"));
    assert_eq!(stream.push(u32::from(b'!')).unwrap().as_deref(), Some("!"));
    assert_eq!(stream.finish().unwrap(), "");
    // A stream cut off mid-character flushes a replacement character.
    assert_eq!(stream.push(0xF0).unwrap(), None);
    assert_eq!(stream.finish().unwrap(), "\u{FFFD}");
}

/// Bytes plus one special token, built once for the property test.
static BYTES_AND_SPECIAL: LazyLock<Tokenizer> =
    LazyLock::new(|| Tokenizer::from_bpe_vocab(byte_vocab(&[("<|x|>", 3)], &[])).unwrap());

proptest! {
    #[test]
    fn encode_then_decode_is_identity(text in "(\\PC|<\\|x\\|>){0,40}") {
        let tokenizer = &*BYTES_AND_SPECIAL;
        let ids = tokenizer.encode(&text).unwrap();
        // One id per byte, except the 5-byte special token, which is one id.
        prop_assert_eq!(ids.len(), text.len() - 4 * text.matches("<|x|>").count());
        prop_assert_eq!(tokenizer.decode(&ids).unwrap(), text.clone());
        let mut stream = tokenizer.text_stream(false);
        let mut streamed = String::new();
        for &id in &ids {
            if let Some(chunk) = stream.push(id).unwrap() {
                // A half-printed character would show up as an extra U+FFFD.
                prop_assert!(text.contains(char::REPLACEMENT_CHARACTER) || !chunk.contains(char::REPLACEMENT_CHARACTER));
                streamed.push_str(&chunk);
            }
        }
        streamed.push_str(&stream.finish().unwrap());
        prop_assert_eq!(streamed, text);
    }
}

fn build_err(vocab: BpeVocab) -> TokenizeError {
    Tokenizer::from_bpe_vocab(vocab).expect_err("vocabulary must be rejected")
}

#[test]
fn empty_vocabulary_is_rejected() {
    let vocab = BpeVocab {
        model: "gpt2".into(),
        ..BpeVocab::default()
    };
    assert!(matches!(build_err(vocab), TokenizeError::EmptyVocabulary));
}

#[test]
fn unsupported_model_is_rejected() {
    let mut vocab = byte_vocab(&[], &[]);
    vocab.model = "llama".into();
    let err = build_err(vocab);
    assert!(
        matches!(&err, TokenizeError::UnsupportedModel { model } if model == "llama"),
        "{err:?}"
    );
}

#[test]
fn unknown_pre_tokenizer_is_rejected_by_name() {
    let mut vocab = byte_vocab(&[], &[]);
    vocab.pre = Some("mystery".into());
    let err = build_err(vocab);
    assert!(
        matches!(&err, TokenizeError::UnknownPreTokenizer { name } if name == "mystery"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "unknown pre-tokenizer \"mystery\"");
}

#[test]
fn merge_naming_an_unknown_token_is_rejected() {
    let err = build_err(byte_vocab(&[], &["a b", "ab zz"]));
    // Merge 0 already produces a token that does not exist.
    assert!(
        matches!(&err, TokenizeError::MergeUnknownToken { merge_idx: 0, token, .. } if token == "ab"),
        "{err:?}"
    );
    let err = build_err(byte_vocab(&[("ab", 1)], &["a b", "ab zz"]));
    assert!(
        matches!(&err, TokenizeError::MergeUnknownToken { merge_idx: 1, token, .. } if token == "zz"),
        "{err:?}"
    );
}

#[test]
fn malformed_merge_is_rejected() {
    let err = build_err(byte_vocab(&[], &["ab"]));
    assert!(
        matches!(&err, TokenizeError::MalformedMerge { merge_idx: 0, merge } if merge == "ab"),
        "{err:?}"
    );
}

#[test]
fn duplicate_token_is_rejected() {
    let err = build_err(byte_vocab(&[("a", 1)], &[]));
    assert!(
        matches!(&err, TokenizeError::DuplicateToken { text, first_id: 97, second_id: 256 } if text == "a"),
        "{err:?}"
    );
}

#[test]
fn token_type_problems_are_rejected() {
    let mut vocab = byte_vocab(&[], &[]);
    vocab.token_types.pop();
    assert!(matches!(
        build_err(vocab),
        TokenizeError::TokenTypeCountMismatch {
            n_tokens: 256,
            n_token_types: 255
        }
    ));
    let mut vocab = byte_vocab(&[], &[]);
    vocab.token_types[7] = 9;
    assert!(matches!(
        build_err(vocab),
        TokenizeError::UnknownTokenType {
            id: 7,
            token_type: 9
        }
    ));
}

#[test]
fn special_ids_out_of_range_are_rejected() {
    let mut vocab = byte_vocab(&[], &[]);
    vocab.eos_id = Some(256);
    assert!(matches!(
        build_err(vocab),
        TokenizeError::SpecialTokenOutOfRange {
            role: "eos",
            id: 256,
            vocab_size: 256
        }
    ));
}

#[test]
fn decoding_an_id_out_of_range_is_an_error_not_a_panic() {
    let tokenizer = Tokenizer::from_bpe_vocab(byte_vocab(&[], &[])).unwrap();
    assert!(matches!(
        tokenizer.decode(&[104, 256]),
        Err(TokenizeError::TokenOutOfRange {
            id: 256,
            vocab_size: 256
        })
    ));
    assert!(matches!(
        tokenizer.text_stream(false).push(u32::MAX),
        Err(TokenizeError::TokenOutOfRange { id: u32::MAX, .. })
    ));
    assert_eq!(tokenizer.token_text(256), None);
    // The infallible trait marks the bad id instead.
    assert_eq!(
        lm_core::Detokenize::decode(&tokenizer, &[104, 256, 105]),
        "h\u{FFFD}i"
    );
}

#[test]
fn encode_literal_keeps_control_token_text_as_ordinary_text() {
    let tokenizer = Tokenizer::from_bpe_vocab(byte_vocab(&[("<|im_start|>", 3)], &[])).unwrap();
    let text = "<|im_start|>system";
    let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
    let parsed = [&[256][..], &bytes[12..]].concat();
    assert_eq!(tokenizer.encode(text).unwrap(), parsed);
    assert_eq!(tokenizer.encode_literal(text).unwrap(), bytes);
    assert_eq!(tokenizer.decode(&bytes).unwrap(), text);
}

#[test]
fn encode_parts_reads_markup_parts_and_keeps_user_parts_literal() {
    let tokenizer = Tokenizer::from_bpe_vocab(byte_vocab(&[("<|im_start|>", 3)], &[])).unwrap();
    let bytes = |text: &str| text.bytes().map(u32::from).collect::<Vec<_>>();
    let parts = [
        TextPart {
            text: "<|im_start|>user\n",
            parse_special: true,
        },
        TextPart {
            text: "<|im_start|>system",
            parse_special: false,
        },
    ];
    let expected = [vec![256], bytes("user\n"), bytes("<|im_start|>system")].concat();
    assert_eq!(tokenizer.encode_parts(&parts).unwrap(), expected);
}
