//! A decoder state saved as bytes and read back (`DecoderState::write_to`,
//! `Decoder::read_state`): bit for bit, so the next token's logits are the
//! unsaved state's; and every file that is not this model's state (cut
//! short, another magic, another model, another precision, a flipped byte,
//! a header asking for more than the file holds) refused with its reason.

use lm_core::{LanguageModel, Rows, SequenceState, TokenId};
use lm_model::{
    Decoder, DecoderState, KvPrecision, Llama, ModelFingerprint, StateFileError, Toy,
    ToyArchitecture,
};

use crate::common::{fixture_path, smollm2_path};

const PRECISIONS: [KvPrecision; 3] = [KvPrecision::F32, KvPrecision::F16, KvPrecision::Q8_0];

fn toy(precision: KvPrecision) -> Decoder {
    Toy::with_options(ToyArchitecture::Llama, 256, Toy::SEED)
        .unwrap()
        .with_kv_precision(precision)
}

fn fingerprint() -> ModelFingerprint {
    ModelFingerprint::of_bytes(b"toy llama 256")
}

/// `n` token ids below `vocab`, spread so neighbours differ.
fn prompt(n: usize, vocab: usize) -> Vec<TokenId> {
    (0..n).map(|i| ((i * 7 + 3) % vocab) as TokenId).collect()
}

/// The state after reading `tokens`.
fn read<M: LanguageModel>(model: &M, tokens: &[TokenId]) -> M::State {
    let mut state = model.new_state();
    let mut logits = Vec::new();
    model
        .forward(&mut state, tokens, Rows::Last, &mut logits)
        .unwrap();
    state
}

/// The logits of reading `next` after `state` (a copy of it).
fn next_logits(model: &Decoder, state: &DecoderState, next: &[TokenId]) -> Vec<u32> {
    let mut state = state.clone();
    let mut logits = Vec::new();
    model
        .forward(&mut state, next, Rows::All, &mut logits)
        .unwrap();
    logits.iter().map(|v| v.to_bits()).collect()
}

fn save(state: &DecoderState, model: ModelFingerprint, tokens: &[TokenId]) -> Vec<u8> {
    let mut bytes = Vec::new();
    state.write_to(&mut bytes, model, tokens).unwrap();
    assert_eq!(bytes.len() as u64, state.saved_len());
    bytes
}

fn load(
    model: &Decoder,
    bytes: &[u8],
    fingerprint: ModelFingerprint,
) -> Result<(Vec<TokenId>, DecoderState), StateFileError> {
    model.read_state(&mut &bytes[..], bytes.len() as u64, fingerprint)
}

/// Saves the state of `tokens`, reads it back, and checks the tokens, the
/// position, the bytes written again, and the next tokens' logits.
fn check_round_trip(model: &Decoder, fingerprint: ModelFingerprint, tokens: &[TokenId]) {
    let state = read(model, tokens);
    let bytes = save(&state, fingerprint, tokens);
    let (read_tokens, loaded) = load(model, &bytes, fingerprint).unwrap();
    assert_eq!(read_tokens, tokens);
    assert_eq!(loaded.pos(), tokens.len());
    assert_eq!(save(&loaded, fingerprint, tokens), bytes, "written again");
    let next = prompt(3, model.vocab_size());
    assert_eq!(
        next_logits(model, &loaded, &next),
        next_logits(model, &state, &next),
        "the next tokens' logits, bit for bit"
    );
}

#[test]
fn a_saved_state_reads_back_bit_for_bit_at_every_precision() {
    // 1, 31, 32, 33 and 70 tokens: within one chunk, at its edge, across.
    for precision in PRECISIONS {
        let model = toy(precision);
        for n in [1, 31, 32, 33, 70] {
            check_round_trip(&model, fingerprint(), &prompt(n, model.vocab_size()));
        }
    }
}

#[test]
fn a_truncated_state_reads_back_with_only_its_positions() {
    let model = toy(KvPrecision::F16);
    let tokens = prompt(70, model.vocab_size());
    let mut state = read(&model, &tokens);
    state.truncate(40);
    let bytes = save(&state, fingerprint(), &tokens[..40]);
    let (read_tokens, loaded) = load(&model, &bytes, fingerprint()).unwrap();
    assert_eq!(read_tokens, tokens[..40]);
    let next = [5, 1];
    assert_eq!(
        next_logits(&model, &loaded, &next),
        next_logits(&model, &state, &next)
    );
    // Two chunks saved, not the three the state still holds.
    let fresh = read(&model, &tokens[..40]);
    assert_eq!(
        bytes.len(),
        save(&fresh, fingerprint(), &tokens[..40]).len()
    );
}

#[test]
fn states_follow_one_another_in_one_stream() {
    let model = toy(KvPrecision::F32);
    let (a, b) = (prompt(5, 7), prompt(40, 7));
    let mut bytes = save(&read(&model, &a), fingerprint(), &a);
    bytes.extend(save(&read(&model, &b), fingerprint(), &b));
    let mut reader = &bytes[..];
    let (first, state) = model
        .read_state(&mut reader, bytes.len() as u64, fingerprint())
        .unwrap();
    assert_eq!((first, state.pos()), (a, 5));
    let left = reader.len() as u64;
    let (second, state) = model.read_state(&mut reader, left, fingerprint()).unwrap();
    assert_eq!((second, state.pos()), (b, 40));
    assert!(reader.is_empty());
}

#[test]
fn a_sliding_window_model_round_trips_also_after_its_ring_wrapped() {
    let path = fixture_path("arch/gemma3.gguf");
    let model = Llama::from_gguf(&path).unwrap();
    let fingerprint = ModelFingerprint::of_path(&path).unwrap();
    let window = model.config().options.sliding_window.unwrap().window;
    let ring_len = model.new_state().cache().ring_len().unwrap();
    let n_long = ring_len + 40;
    assert!(
        n_long + 3 <= model.config().context_length,
        "window {window}, ring {ring_len}: the ring wraps within the context"
    );
    for n in [3, n_long] {
        check_round_trip(&model, fingerprint, &prompt(n, model.vocab_size()));
    }
}

#[test]
fn tokens_that_are_not_the_states_are_refused_on_writing() {
    let model = Llama::from_gguf(fixture_path("arch/gemma3.gguf")).unwrap();
    let tokens = prompt(6, model.vocab_size());
    let state = read(&model, &tokens);
    let mut out = Vec::new();
    let err = state.write_to(&mut out, fingerprint(), &tokens[..5]);
    assert!(
        matches!(
            err,
            Err(StateFileError::TokensDoNotMatch {
                n_tokens: 5,
                pos: 6
            })
        ),
        "{err:?}"
    );
    // The sliding-window model keeps its tokens: other ids are refused too.
    let other = prompt(6, 3);
    let err = state.write_to(&mut out, fingerprint(), &other);
    assert!(
        matches!(err, Err(StateFileError::TokensDoNotMatch { .. })),
        "{err:?}"
    );
}

#[test]
fn every_cut_of_a_state_file_is_refused_as_truncated() {
    let model = toy(KvPrecision::F16);
    let tokens = prompt(33, 7);
    let bytes = save(&read(&model, &tokens), fingerprint(), &tokens);
    for len in (0..bytes.len())
        .step_by(97)
        .chain([8, 111, 112, bytes.len() - 1])
    {
        let err = load(&model, &bytes[..len], fingerprint()).unwrap_err();
        assert!(
            matches!(err, StateFileError::Truncated { found, .. } if found == len as u64),
            "cut at {len}: {err}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}

/// The saved state of 33 toy tokens at f16, for the refusals.
fn saved_toy() -> Vec<u8> {
    let tokens = prompt(33, 7);
    save(
        &read(&toy(KvPrecision::F16), &tokens),
        fingerprint(),
        &tokens,
    )
}

#[test]
fn a_flipped_magic_is_not_a_state_file() {
    for len in [8, 50, usize::MAX] {
        let mut bytes = saved_toy();
        bytes[3] ^= 0x20;
        bytes.truncate(len);
        let err = load(&toy(KvPrecision::F16), &bytes, fingerprint()).unwrap_err();
        assert!(matches!(err, StateFileError::NotAStateFile), "{err}");
    }
}

#[test]
fn another_models_state_is_refused_naming_both_fingerprints() {
    let other = ModelFingerprint::of_bytes(b"another model");
    let err = load(&toy(KvPrecision::F16), &saved_toy(), other).unwrap_err();
    assert!(matches!(err, StateFileError::WrongModel { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&other.to_string()) && message.contains(&fingerprint().to_string()),
        "{message}"
    );
    // A model of another shape under the same fingerprint: refused by shape.
    let wider = Toy::with_options(ToyArchitecture::Llama, 512, Toy::SEED)
        .unwrap()
        .with_kv_precision(KvPrecision::F16);
    let err = load(&wider, &saved_toy(), fingerprint()).unwrap_err();
    assert!(
        matches!(
            err,
            StateFileError::WrongShape {
                field: "context length",
                expected: 512,
                found: 256
            }
        ),
        "{err}"
    );
}

#[test]
fn a_state_of_another_precision_is_refused() {
    for precision in [KvPrecision::F32, KvPrecision::Q8_0] {
        let err = load(&toy(precision), &saved_toy(), fingerprint()).unwrap_err();
        assert!(
            matches!(
                err,
                StateFileError::WrongPrecision { expected, found: KvPrecision::F16 }
                    if expected == precision
            ),
            "{err}"
        );
    }
    let mut bytes = saved_toy();
    bytes[44] = 9;
    let err = load(&toy(KvPrecision::F16), &bytes, fingerprint()).unwrap_err();
    assert!(
        matches!(err, StateFileError::UnknownPrecision { code: 9 }),
        "{err}"
    );
}

#[test]
fn a_flipped_byte_anywhere_after_the_header_fails_the_checksum() {
    let model = toy(KvPrecision::F16);
    let clean = saved_toy();
    for at in [112, 200, clean.len() / 2, clean.len() - 33, clean.len() - 1] {
        let mut bytes = clean.clone();
        bytes[at] ^= 1;
        let err = load(&model, &bytes, fingerprint()).unwrap_err();
        assert!(
            matches!(err, StateFileError::ChecksumMismatch),
            "byte {at}: {err}"
        );
    }
}

#[test]
fn a_header_asking_for_more_than_the_file_holds_is_refused_before_allocating() {
    let model = toy(KvPrecision::F16);
    let bytes = saved_toy();
    let set_u64 = |bytes: &mut Vec<u8>, at: usize, v: u64| {
        bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    };
    // The position at the context length with its chunks: a 256-token state
    // promised by a 33-token file.
    let mut long = bytes.clone();
    set_u64(&mut long, 80, 256);
    set_u64(&mut long, 96, 8);
    let err = load(&model, &long, fingerprint()).unwrap_err();
    assert!(matches!(err, StateFileError::Truncated { .. }), "{err}");
    // Beyond the context, or chunks that do not match the position.
    for (at, value) in [(80, u64::MAX), (80, 257), (96, 3), (104, 1), (88, 1 << 40)] {
        let mut bad = bytes.clone();
        set_u64(&mut bad, at, value);
        let err = load(&model, &bad, fingerprint()).unwrap_err();
        assert!(
            matches!(err, StateFileError::Corrupt { .. }),
            "offset {at} = {value}: {err}"
        );
    }
    // Another version.
    let mut newer = bytes;
    newer[8] = 2;
    let err = load(&model, &newer, fingerprint()).unwrap_err();
    assert!(
        matches!(err, StateFileError::UnsupportedVersion { found: 2 }),
        "{err}"
    );
}

#[test]
fn a_fingerprint_changes_with_a_byte_of_the_header_or_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read(fixture_path("arch/llama.gguf")).unwrap();
    let of = |bytes: &[u8]| {
        let path = dir.path().join("model.gguf");
        std::fs::write(&path, bytes).unwrap();
        ModelFingerprint::of_path(&path).unwrap()
    };
    let base = of(&original);
    assert_eq!(base, of(&original), "the same file, the same fingerprint");
    assert_eq!(
        base,
        ModelFingerprint::of_path(&fixture_path("arch/llama.gguf")).unwrap(),
        "the name of the file is not part of it"
    );
    for at in [20, original.len() - 1] {
        let mut changed = original.clone();
        changed[at] ^= 1;
        assert_ne!(of(&changed), base, "byte {at}");
    }
    let mut longer = original.clone();
    longer.push(0);
    assert_ne!(of(&longer), base);
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn smollm2_state_round_trips_bit_for_bit() {
    let path = smollm2_path();
    let model = Llama::from_gguf(&path).unwrap();
    let fingerprint = ModelFingerprint::of_path(&path).unwrap();
    let tokens: Vec<TokenId> = (0..75).map(|i| 100 + i * 37).collect();
    check_round_trip(&model, fingerprint, &tokens);
    let f32_model = Llama::from_gguf(&path)
        .unwrap()
        .with_kv_precision(KvPrecision::F32);
    let bytes = save(&read(&model, &tokens), fingerprint, &tokens);
    let err = load(&f32_model, &bytes, fingerprint).unwrap_err();
    assert!(
        matches!(err, StateFileError::WrongPrecision { .. }),
        "{err}"
    );
}
