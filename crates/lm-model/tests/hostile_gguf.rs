//! Hostile GGUF files, committed under `fixtures/hostile/gguf/`: one file per
//! way a header, a metadata value, a tensor table, an architecture or a
//! tokenizer vocabulary can be wrong (the GGUF CVE history of llama.cpp and
//! candle is the checklist: allocations sized by header counts, unchecked
//! size arithmetic, alignment 0).
//!
//! Each file is built here by a recipe: a valid tiny llama model with one
//! defect, or a header written byte by byte. The tests check that the
//! committed files are exactly what the recipes write, and that reading each
//! committed file gives the typed error that names its defect.
//! `fixtures/hostile/gguf/expected.tsv` lists every file with its stage and a
//! fragment of the message; lm-cli's `hostile_inputs` test runs the command
//! line on the same files with that list.
//!
//! Regenerate the files and the list after changing a recipe:
//! `LM_HOSTILE_UPDATE=1 cargo test -p lm-model --test tests hostile_gguf`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use lm_model::{GgufError, GgufFile, MetadataValue, NonFinite, QuantError};
use lm_model::{Llama, TransformerError};

use crate::common::fixture_path;
use crate::common::gguf_writer::{F32, GgufTensor, GgufWriter, gguf_file, one_tensor_file};

// ---------------------------------------------------------------------------
// The valid tiny model the defects are made in.
// ---------------------------------------------------------------------------

/// A model as metadata pairs and f32 tensors, written as GGUF v3 with the
/// default alignment of 32.
struct Model {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<GgufTensor>,
}

impl Model {
    fn bytes(&self) -> Vec<u8> {
        gguf_file(3, 32, &self.metadata, &self.tensors)
    }

    fn set(mut self, key: &str, value: MetadataValue) -> Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    fn remove_key(mut self, key: &str) -> Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    fn remove_tensors(mut self, names: &[&str]) -> Self {
        self.tensors.retain(|t| !names.contains(&t.name.as_str()));
        self
    }
}

const N_EMBD: u64 = 4;
const N_HEAD: u32 = 2;
const N_KV_HEAD: u32 = 1;
const FFN_DIM: u64 = 8;
const CONTEXT: u32 = 16;

/// The vocabulary of the tiny model: an end token, then byte-level pieces
/// whose merges make "hi" and "ab".
const TOKENS: [&str; 8] = ["<|endoftext|>", "h", "i", "hi", "Ġ", "a", "b", "ab"];

fn strings(items: &[&str]) -> MetadataValue {
    MetadataValue::Array(
        items
            .iter()
            .map(|s| MetadataValue::String((*s).to_owned()))
            .collect(),
    )
}

/// A valid one-layer llama model with 4-wide embeddings, 2 query heads, 1
/// key/value head and an 8-token byte-level BPE vocabulary. Every llama and
/// tokenizer case below is this model with one defect.
fn tiny_llama() -> Model {
    use MetadataValue as V;
    let metadata = vec![
        ("general.architecture", V::String("llama".into())),
        ("llama.block_count", V::U32(1)),
        ("llama.context_length", V::U32(CONTEXT)),
        ("llama.embedding_length", V::U32(N_EMBD as u32)),
        ("llama.feed_forward_length", V::U32(FFN_DIM as u32)),
        ("llama.attention.head_count", V::U32(N_HEAD)),
        ("llama.attention.head_count_kv", V::U32(N_KV_HEAD)),
        ("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5)),
        ("tokenizer.ggml.model", V::String("gpt2".into())),
        ("tokenizer.ggml.pre", V::String("smollm".into())),
        ("tokenizer.ggml.tokens", strings(&TOKENS)),
        (
            "tokenizer.ggml.token_type",
            V::Array([3, 1, 1, 1, 1, 1, 1, 1].map(V::I32).to_vec()),
        ),
        ("tokenizer.ggml.merges", strings(&["h i", "a b"])),
        ("tokenizer.ggml.bos_token_id", V::U32(0)),
        ("tokenizer.ggml.eos_token_id", V::U32(0)),
    ];
    let n_vocab = TOKENS.len() as u64;
    let kv_dim = N_EMBD / u64::from(N_HEAD) * u64::from(N_KV_HEAD);
    let shapes: [(&str, Vec<u64>); 11] = [
        ("token_embd.weight", vec![N_EMBD, n_vocab]),
        ("output_norm.weight", vec![N_EMBD]),
        ("blk.0.attn_norm.weight", vec![N_EMBD]),
        ("blk.0.attn_q.weight", vec![N_EMBD, N_EMBD]),
        ("blk.0.attn_k.weight", vec![N_EMBD, kv_dim]),
        ("blk.0.attn_v.weight", vec![N_EMBD, kv_dim]),
        ("blk.0.attn_output.weight", vec![N_EMBD, N_EMBD]),
        ("blk.0.ffn_norm.weight", vec![N_EMBD]),
        ("blk.0.ffn_gate.weight", vec![N_EMBD, FFN_DIM]),
        ("blk.0.ffn_up.weight", vec![N_EMBD, FFN_DIM]),
        ("blk.0.ffn_down.weight", vec![FFN_DIM, N_EMBD]),
    ];
    // Small deterministic weights: norms of one, matrices in [-0.5, 0.5].
    let mut next = 0u32;
    let tensors = shapes
        .into_iter()
        .map(|(name, dims)| {
            let n: u64 = dims.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    next += 1;
                    if dims.len() == 1 {
                        1.0
                    } else {
                        ((next * 37) % 11) as f32 / 10.0 - 0.5
                    }
                })
                .collect();
            GgufTensor::f32(name, dims, &values)
        })
        .collect();
    Model {
        metadata: metadata
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        tensors,
    }
}

/// The tiny model with the metadata `key` set to `value`, as a file.
fn llama_with(key: &str, value: MetadataValue) -> Vec<u8> {
    tiny_llama().set(key, value).bytes()
}

/// The tiny model without the tensors `names`, as a file.
fn llama_without_tensors(names: &[&str]) -> Vec<u8> {
    tiny_llama().remove_tensors(names).bytes()
}

/// The tiny model with the tensor `name` replaced by f32 `values` of shape
/// `dims`, as a file.
fn llama_with_f32_tensor(name: &str, dims: Vec<u64>, values: &[f32]) -> Vec<u8> {
    let mut model = tiny_llama();
    let tensor = model.tensors.iter_mut().find(|t| t.name == name).unwrap();
    *tensor = GgufTensor::f32(name, dims, values);
    model.bytes()
}

// ---------------------------------------------------------------------------
// The cases.
// ---------------------------------------------------------------------------

/// Which reader names the defect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// `GgufFile` refuses the file.
    Parse,
    /// The file parses; `Llama::from_file` refuses it.
    Llama,
    /// The file parses and loads as a model; the tokenizer built from its
    /// metadata (lm-cli's mapping) refuses it. Checked by lm-cli's tests.
    Tokenizer,
    /// A valid file, the control for the others.
    Valid,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Parse => "parse",
            Stage::Llama => "llama",
            Stage::Tokenizer => "tokenizer",
            Stage::Valid => "valid",
        }
    }
}

/// What reading a file gave.
#[derive(Debug)]
enum Outcome {
    Parse(GgufError),
    Llama(TransformerError),
    Loaded,
}

/// What reading a file must give: the stage that refuses it and, for this
/// crate's stages, the typed error.
#[derive(Clone, Copy)]
enum Expected {
    /// `GgufFile` refuses the file with an error this accepts.
    Parse(fn(&GgufError) -> bool),
    /// `Llama::from_file` refuses it with an error this accepts.
    Llama(fn(&TransformerError) -> bool),
    /// It loads; the tokenizer refuses it (checked by lm-cli's tests).
    Tokenizer,
    /// It loads; the control.
    Valid,
}

impl Expected {
    fn stage(self) -> Stage {
        match self {
            Expected::Parse(_) => Stage::Parse,
            Expected::Llama(_) => Stage::Llama,
            Expected::Tokenizer => Stage::Tokenizer,
            Expected::Valid => Stage::Valid,
        }
    }

    /// Whether `outcome` is the expected error (or a load, for the stages
    /// past this crate).
    fn accepts(self, outcome: &Outcome) -> bool {
        match (self, outcome) {
            (Expected::Parse(check), Outcome::Parse(error)) => check(error),
            (Expected::Llama(check), Outcome::Llama(error)) => check(error),
            (Expected::Tokenizer | Expected::Valid, Outcome::Loaded) => true,
            _ => false,
        }
    }
}

/// One hostile file.
struct Case {
    file: &'static str,
    bytes: Vec<u8>,
    /// A fragment of the error message that names the defect.
    message: &'static str,
    expected: Expected,
}

/// `Expected::Parse` of the errors that match a pattern.
macro_rules! parse {
    ($($pattern:tt)+) => {
        Expected::Parse(|e| matches!(e, $($pattern)+))
    };
}

/// `Expected::Llama` of the errors that match a pattern.
macro_rules! llama {
    ($($pattern:tt)+) => {
        Expected::Llama(|e| matches!(e, $($pattern)+))
    };
}

fn case(file: &'static str, bytes: Vec<u8>, message: &'static str, expected: Expected) -> Case {
    Case {
        file,
        bytes,
        message,
        expected,
    }
}

/// A header with the given metadata pairs and no tensors.
fn only_metadata(pairs: &[(&str, MetadataValue)]) -> Vec<u8> {
    pairs
        .iter()
        .fold(
            GgufWriter::header(3, 0, pairs.len() as u64),
            |w, (key, value)| w.kv(key, value),
        )
        .finish()
}

fn cases() -> Vec<Case> {
    use Expected::{Tokenizer, Valid};
    use MetadataValue as V;
    let mut nested_too_deep = V::U8(1);
    for _ in 0..9 {
        nested_too_deep = V::Array(vec![nested_too_deep]);
    }
    vec![
        case("valid-tiny-llama.gguf", tiny_llama().bytes(), "", Valid),
        // A context length of 2^32 - 1 is legal: it bounds positions, and
        // nothing is allocated by it (RoPE angles are computed per position,
        // the KV cache grows with use).
        case(
            "valid-context-length-u32-max.gguf",
            llama_with("llama.context_length", V::U32(u32::MAX)),
            "",
            Valid,
        ),
        // A chat template that does not compile is a chat's problem, not the
        // file's: the model loads and generates; only a chat is refused.
        case(
            "valid-broken-chat-template.gguf",
            llama_with(
                "tokenizer.chat_template",
                V::String("{% for m in messages %}{{ m.content }".into()),
            ),
            "",
            Valid,
        ),
        // A chat model small enough for lm-cli's chat tests (the words
        // are "hi" and "ab"; the template joins the messages with spaces).
        case(
            "valid-chat-tiny-llama.gguf",
            tiny_llama()
                .set("llama.context_length", V::U32(4096))
                .set(
                    "tokenizer.chat_template",
                    V::String("{% for m in messages %}{{ m.content }} {% endfor %}".into()),
                )
                .bytes(),
            "",
            Valid,
        ),
        // A chat template that never ends in practice (two nested loops of
        // 100,000): every front end must stop it by its fuel, not hang.
        case(
            "valid-endless-chat-template.gguf",
            tiny_llama()
                .set("llama.context_length", V::U32(4096))
                .set(
                    "tokenizer.chat_template",
                    V::String(
                        "{% for i in range(100000) %}{% for j in range(100000) %}\
                         {{ i }}{% endfor %}{% endfor %}"
                            .into(),
                    ),
                )
                .bytes(),
            "",
            Valid,
        ),
        // --- header ---
        case(
            "wrong-magic.gguf",
            {
                let mut bytes = tiny_llama().bytes();
                bytes[..4].copy_from_slice(b"GGML");
                bytes
            },
            "not a gguf file: magic is 0x47474d4c (\"GGML\"), expected 0x47475546 (\"GGUF\")",
            parse!(GgufError::BadMagic { found } if found == b"GGML"),
        ),
        case(
            "empty.gguf",
            Vec::new(),
            "not a gguf file: the file is empty",
            parse!(GgufError::BadMagic { found } if found.is_empty()),
        ),
        case(
            "unsupported-version-4.gguf",
            GgufWriter::header(4, 0, 0).finish(),
            "unsupported gguf version 4",
            parse!(GgufError::UnsupportedVersion { version: 4 }),
        ),
        case(
            "unsupported-version-big-endian.gguf",
            GgufWriter::default()
                .raw(b"GGUF")
                .raw(&3u32.to_be_bytes())
                .u64(0)
                .u64(0)
                .finish(),
            "unsupported gguf version 50331648",
            parse!(GgufError::UnsupportedVersion {
                version: 0x0300_0000
            }),
        ),
        case(
            "truncated-header.gguf",
            GgufWriter::header(3, 0, 0).finish()[..14].to_vec(),
            "file truncated reading tensor count at offset 8",
            parse!(GgufError::Truncated {
                what: "tensor count",
                offset: 8,
                needed: 8,
                available: 6
            }),
        ),
        case(
            "truncated-in-tensor-data.gguf",
            {
                let bytes = tiny_llama().bytes();
                bytes[..bytes.len() - 40].to_vec()
            },
            "lies outside the data section",
            parse!(GgufError::TensorOutOfBounds { name, .. } if name == "blk.0.ffn_down.weight"),
        ),
        case(
            "tensor-count-beyond-file.gguf",
            GgufWriter::header(3, u64::MAX / 2, 0).finish(),
            "tensor info count 9223372036854775807 at offset 8 cannot fit",
            parse!(GgufError::CountBeyondFile {
                what: "tensor info",
                count: 0x7fff_ffff_ffff_ffff,
                remaining: 0,
                ..
            }),
        ),
        case(
            "metadata-count-beyond-file.gguf",
            GgufWriter::header(3, 0, 1 << 40)
                .kv("a", &V::U8(1))
                .finish(),
            "metadata pair count 1099511627776 at offset 16 cannot fit",
            parse!(GgufError::CountBeyondFile {
                what: "metadata pair",
                count: 0x100_0000_0000,
                offset: 16,
                ..
            }),
        ),
        case(
            "string-length-beyond-file.gguf",
            GgufWriter::header(3, 0, 1)
                .u64(1 << 62)
                .raw(b"general.name")
                .finish(),
            "metadata key at offset 32 has length 4611686018427387904",
            parse!(GgufError::StringBeyondFile {
                what: "metadata key",
                len: 0x4000_0000_0000_0000,
                offset: 32,
                remaining: 12
            }),
        ),
        case(
            "string-value-length-u64-max.gguf",
            GgufWriter::header(3, 0, 1)
                .str("general.name")
                .u32(8)
                .u64(u64::MAX)
                .raw(b"x")
                .finish(),
            "string value at offset 56 has length 18446744073709551615",
            parse!(GgufError::StringBeyondFile {
                what: "string value",
                len: u64::MAX,
                ..
            }),
        ),
        case(
            "array-of-2-pow-40-elements.gguf",
            GgufWriter::header(3, 0, 1)
                .str("tokenizer.ggml.tokens")
                .u32(9)
                .u32(8)
                .u64(1 << 40)
                .str("a")
                .str("b")
                .finish(),
            "array element count 1099511627776",
            parse!(GgufError::CountBeyondFile {
                what: "array element",
                count: 0x100_0000_0000,
                min_item_bytes: 8,
                ..
            }),
        ),
        case(
            "nested-arrays-2-pow-40-inner-elements.gguf",
            {
                // An array of 2 arrays that each claim 2^40 bytes.
                GgufWriter::header(3, 0, 1)
                    .str("t.nested")
                    .u32(9)
                    .u32(9)
                    .u64(2)
                    .u32(0)
                    .u64(1 << 40)
                    .raw(&[7; 16])
                    .finish()
            },
            "array element count 1099511627776",
            parse!(GgufError::CountBeyondFile {
                what: "array element",
                count: 0x100_0000_0000,
                min_item_bytes: 1,
                ..
            }),
        ),
        case(
            "nested-arrays-too-deep.gguf",
            only_metadata(&[("t.deep", nested_too_deep)]),
            "arrays nested deeper than 8 levels",
            parse!(GgufError::NestingTooDeep { max_depth: 8, .. }),
        ),
        case(
            "unknown-value-type.gguf",
            GgufWriter::header(3, 0, 1)
                .str("general.name")
                .u32(13)
                .u32(0)
                .finish(),
            "unknown metadata value type 13",
            parse!(GgufError::UnknownValueType { type_id: 13, .. }),
        ),
        case(
            "unknown-array-element-type.gguf",
            GgufWriter::header(3, 0, 1)
                .str("t.array")
                .u32(9)
                .u32(0xffff_ffff)
                .u64(1 << 40)
                .finish(),
            "unknown metadata value type 4294967295",
            parse!(GgufError::UnknownValueType {
                type_id: u32::MAX,
                ..
            }),
        ),
        case(
            "invalid-bool.gguf",
            GgufWriter::header(3, 0, 1)
                .str("tokenizer.ggml.add_bos_token")
                .u32(7)
                .raw(&[2])
                .finish(),
            "invalid bool byte 2",
            parse!(GgufError::InvalidBool { value: 2, .. }),
        ),
        case(
            "key-not-utf8.gguf",
            GgufWriter::header(3, 0, 1)
                .u64(2)
                .raw(&[0xc3, 0x28])
                .u32(0)
                .raw(&[1])
                .finish(),
            "metadata key at offset 32 is not valid utf-8",
            parse!(GgufError::InvalidUtf8 {
                what: "metadata key",
                offset: 32
            }),
        ),
        case(
            "duplicate-key.gguf",
            only_metadata(&[
                ("general.architecture", V::String("llama".into())),
                ("llama.block_count", V::U32(1)),
                ("general.architecture", V::String("gpt2".into())),
            ]),
            "duplicate metadata key \"general.architecture\"",
            parse!(GgufError::DuplicateKey { key } if key == "general.architecture"),
        ),
        case(
            "alignment-zero.gguf",
            only_metadata(&[("general.alignment", V::U32(0))]),
            "alignment 0 is not a power of two",
            parse!(GgufError::BadAlignment { alignment: 0 }),
        ),
        case(
            "alignment-not-power-of-two.gguf",
            only_metadata(&[("general.alignment", V::U32(48))]),
            "alignment 48 is not a power of two",
            parse!(GgufError::BadAlignment { alignment: 48 }),
        ),
        case(
            "alignment-wrong-type.gguf",
            only_metadata(&[("general.alignment", V::String("32".into()))]),
            "metadata key \"general.alignment\" holds string, expected an integer",
            parse!(GgufError::WrongType { key, found: "string", .. } if key == "general.alignment"),
        ),
        case(
            "alignment-2-pow-63-data-past-end.gguf",
            GgufWriter::header(3, 1, 1)
                .kv("general.alignment", &V::U64(1 << 63))
                .tensor_info("t", &[8], F32, 0)
                .pad_to(32)
                .raw(&[0; 32])
                .finish(),
            "lies outside the data section of 0 bytes",
            parse!(GgufError::TensorOutOfBounds {
                n_bytes: 32,
                data_len: 0,
                ..
            }),
        ),
        // --- tensor table ---
        case(
            "dims-product-overflows-u64.gguf",
            one_tensor_file("t", &[1 << 32, 1 << 32, 2], F32, 0, 32),
            "has dimensions [4294967296, 4294967296, 2] whose size overflows",
            parse!(GgufError::DimsOverflow { dims, .. } if dims == &[1 << 32, 1 << 32, 2]),
        ),
        case(
            "dims-bytes-overflow-u64.gguf",
            // 2^62 elements fit in u64, their 2^64 bytes of f32 do not.
            one_tensor_file("t", &[1 << 31, 1 << 31], F32, 0, 32),
            "whose size overflows",
            parse!(GgufError::DimsOverflow { .. }),
        ),
        case(
            "too-many-dimensions.gguf",
            one_tensor_file("t", &[1, 1, 1, 1, 1], F32, 0, 32),
            "has 5 dimensions, expected 1 to 4",
            parse!(GgufError::BadDimCount { n_dims: 5, .. }),
        ),
        case(
            "zero-dimensions.gguf",
            one_tensor_file("t", &[], F32, 0, 32),
            "has 0 dimensions, expected 1 to 4",
            parse!(GgufError::BadDimCount { n_dims: 0, .. }),
        ),
        case(
            "unknown-tensor-type.gguf",
            one_tensor_file("t", &[8], 99, 0, 32),
            "tensor \"t\": unknown type id 99; supported: f32, f16, q4_0",
            parse!(GgufError::UnknownTensorType { type_id: 99, .. }),
        ),
        case(
            "quantized-row-not-whole-blocks.gguf",
            // Q8_0 (type 8) packs 32 values per block; a row of 40 is not whole blocks.
            one_tensor_file("t", &[40, 1], 8, 0, 64),
            "has rows of 40 elements, not a multiple of 32",
            parse!(GgufError::RowNotBlockMultiple { row_len: 40, .. }),
        ),
        case(
            "tensor-offset-outside-data.gguf",
            one_tensor_file("t", &[8], F32, 1 << 20, 32),
            "data [1048576, 1048576 + 32) lies outside the data section of 32 bytes",
            parse!(GgufError::TensorOutOfBounds {
                offset: 0x10_0000,
                n_bytes: 32,
                data_len: 32,
                ..
            }),
        ),
        case(
            "tensor-offset-u64-max.gguf",
            // The offset is a multiple of no alignment but 1; pick one that is
            // aligned so that the end (offset + size) overflows instead.
            one_tensor_file("t", &[8], F32, u64::MAX - 31, 32),
            "lies outside the data section",
            parse!(GgufError::TensorOutOfBounds { .. }),
        ),
        case(
            "tensor-offset-misaligned.gguf",
            one_tensor_file("t", &[4], F32, 4, 64),
            "data offset 4 is not a multiple of the alignment 32",
            parse!(GgufError::TensorMisaligned {
                offset: 4,
                alignment: 32,
                ..
            }),
        ),
        case(
            "duplicate-tensor-name.gguf",
            GgufWriter::header(3, 2, 0)
                .tensor_info("t", &[8], F32, 0)
                .tensor_info("t", &[8], F32, 32)
                .pad_to(32)
                .raw(&[0; 64])
                .finish(),
            "duplicate tensor name \"t\"",
            parse!(GgufError::DuplicateTensor { name } if name == "t"),
        ),
        // --- architecture (the llama loader) ---
        case(
            "llama-head-count-does-not-divide-embedding.gguf",
            llama_with("llama.attention.head_count", V::U32(3)),
            "head count 3 does not divide the embedding size 4",
            llama!(TransformerError::HeadCountDoesNotDivide {
                n_embd: 4,
                n_head: 3
            }),
        ),
        case(
            "llama-head-count-zero.gguf",
            llama_with("llama.attention.head_count", V::U32(0)),
            "head count 0 does not divide the embedding size 4",
            llama!(TransformerError::HeadCountDoesNotDivide { n_head: 0, .. }),
        ),
        case(
            "llama-missing-tensors.gguf",
            llama_without_tensors(&["output_norm.weight", "blk.0.ffn_up.weight"]),
            "missing tensors: output_norm.weight, blk.0.ffn_up.weight",
            llama!(TransformerError::MissingTensors { names }
                if names == &["output_norm.weight", "blk.0.ffn_up.weight"]),
        ),
        case(
            "llama-block-count-u32-max.gguf",
            llama_with("llama.block_count", V::U32(u32::MAX)),
            "block count 4294967295 is more layers than the file has tensors",
            llama!(TransformerError::TooFewTensorsForLayers {
                n_layer: 4294967295,
                ..
            }),
        ),
        case(
            "llama-missing-metadata.gguf",
            tiny_llama()
                .remove_key("llama.embedding_length")
                .remove_key("llama.attention.head_count")
                .bytes(),
            "missing metadata keys: llama.embedding_length, llama.attention.head_count",
            llama!(TransformerError::MissingMetadata { keys }
                if keys == &["llama.embedding_length", "llama.attention.head_count"]),
        ),
        case(
            "llama-rope-freq-base-nan.gguf",
            llama_with("llama.rope.freq_base", V::F32(f32::NAN)),
            "rope frequency base (rope.freq_base) must be finite and positive, got NaN",
            llama!(TransformerError::InvalidScale { name, value }
                if name.contains("rope.freq_base") && value.is_nan()),
        ),
        case(
            "llama-rope-freq-base-inf.gguf",
            llama_with("llama.rope.freq_base", V::F32(f32::INFINITY)),
            "rope frequency base (rope.freq_base) must be finite and positive, got inf",
            llama!(TransformerError::InvalidScale { name, value }
                if name.contains("rope.freq_base") && *value == f32::INFINITY),
        ),
        case(
            "llama-block-count-wrong-type.gguf",
            llama_with("llama.block_count", V::String("1".into())),
            "metadata key \"llama.block_count\" holds string, expected an integer",
            llama!(TransformerError::Gguf(GgufError::WrongType { key, .. })
                if key == "llama.block_count"),
        ),
        case(
            "llama-embedding-length-negative.gguf",
            llama_with("llama.embedding_length", V::I32(-4)),
            "metadata key \"llama.embedding_length\" holds -4, which does not fit in u32",
            llama!(TransformerError::Gguf(GgufError::ValueOutOfRange {
                value: -4,
                ..
            })),
        ),
        case(
            "llama-tensor-shape-disagrees.gguf",
            {
                // Two key/value heads' worth of rows where the metadata says one.
                llama_with_f32_tensor(
                    "blk.0.attn_k.weight",
                    vec![N_EMBD, N_EMBD],
                    &[0.25; (N_EMBD * N_EMBD) as usize],
                )
            },
            "tensor blk.0.attn_k.weight has shape [4, 4], expected [4, 2]",
            llama!(TransformerError::TensorShape { name, .. } if name == "blk.0.attn_k.weight"),
        ),
        case(
            "llama-other-architecture.gguf",
            llama_with("general.architecture", V::String("mamba".into())),
            "architecture `mamba` is not supported; supported: llama, qwen2, qwen3, gemma3",
            llama!(TransformerError::UnsupportedArchitecture { found } if found == "mamba"),
        ),
        case(
            "llama-q5_0-scale-nan.gguf",
            {
                // A Q5_0 tensor of two blocks whose second scale is f16 NaN.
                let mut model = tiny_llama();
                let mut data = vec![0x00, 0x3C]; // block 0: d = 1.0
                data.extend([0x55; 20]);
                data.extend([0x00, 0x7E]); // block 1: d = NaN
                data.extend([0x55; 20]);
                model.tensors.push(GgufTensor {
                    name: "extra.weight".into(),
                    dims: vec![64],
                    type_id: 6,
                    data,
                });
                model.bytes()
            },
            "tensor \"extra.weight\": block 1 of q5_0 data has scale d = NaN",
            llama!(TransformerError::Gguf(GgufError::InvalidTensorData {
                name,
                defect: QuantError::NonFiniteValue { block_idx: 1, value: NonFinite::NaN, .. },
            }) if name == "extra.weight"),
        ),
        case(
            "llama-norm-weight-infinite.gguf",
            llama_with_f32_tensor(
                "output_norm.weight",
                vec![N_EMBD],
                &[1.0, 1.0, f32::INFINITY, 1.0],
            ),
            "tensor \"output_norm.weight\": block 2 of f32 data has value = inf",
            llama!(TransformerError::Gguf(GgufError::InvalidTensorData {
                defect: QuantError::NonFiniteValue {
                    block_idx: 2,
                    value: NonFinite::Infinity,
                    ..
                },
                ..
            })),
        ),
        // --- tokenizer metadata (refused by lm-cli's GGUF -> BpeVocab mapping) ---
        case(
            "tokenizer-empty-vocabulary.gguf",
            tiny_llama()
                .set("tokenizer.ggml.tokens", V::Array(Vec::new()))
                .remove_key("tokenizer.ggml.token_type")
                .remove_key("tokenizer.ggml.merges")
                .remove_key("tokenizer.ggml.bos_token_id")
                .remove_key("tokenizer.ggml.eos_token_id")
                .bytes(),
            "the vocabulary is empty",
            Tokenizer,
        ),
        case(
            "tokenizer-tokens-wrong-type.gguf",
            llama_with("tokenizer.ggml.tokens", V::U32(8)),
            "metadata key \"tokenizer.ggml.tokens\" holds u32, expected an array of strings",
            Tokenizer,
        ),
        case(
            "tokenizer-tokens-array-of-integers.gguf",
            llama_with(
                "tokenizer.ggml.tokens",
                V::Array((0..8).map(V::U32).collect()),
            ),
            "metadata key \"tokenizer.ggml.tokens\" holds an array of u32, expected an array of strings",
            Tokenizer,
        ),
        case(
            "tokenizer-eos-id-out-of-range.gguf",
            llama_with("tokenizer.ggml.eos_token_id", V::U32(1000)),
            "eos token id 1000 is out of range for a vocabulary of 8",
            Tokenizer,
        ),
        case(
            "tokenizer-merge-unknown-token.gguf",
            llama_with("tokenizer.ggml.merges", strings(&["h i", "x y"])),
            "merge 1 (\"x y\") needs the unknown token",
            Tokenizer,
        ),
        case(
            "tokenizer-duplicate-token.gguf",
            llama_with(
                "tokenizer.ggml.tokens",
                strings(&["<|endoftext|>", "h", "i", "hi", "Ġ", "a", "b", "h"]),
            ),
            "token 7 repeats the text \"h\" of token 1",
            Tokenizer,
        ),
        case(
            "tokenizer-token-type-count-mismatch.gguf",
            llama_with("tokenizer.ggml.token_type", V::Array(vec![V::I32(1); 3])),
            "3 token types for 8 tokens",
            Tokenizer,
        ),
        case(
            "tokenizer-unsupported-model.gguf",
            llama_with("tokenizer.ggml.model", V::String("bert".into())),
            "unsupported tokenizer model \"bert\"",
            Tokenizer,
        ),
    ]
}

// ---------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------

fn hostile_dir() -> PathBuf {
    fixture_path("hostile/gguf")
}

const MANIFEST: &str = "expected.tsv";

/// The manifest lm-cli's test reads: file, stage, message fragment.
fn manifest(cases: &[Case]) -> String {
    let mut out = String::from(
        "# Written by `LM_HOSTILE_UPDATE=1 cargo test -p lm-model --test tests hostile_gguf`.\n\
         # file\tstage\tmessage fragment\n",
    );
    for case in cases {
        out.push_str(&format!(
            "{}\t{}\t{}\n",
            case.file,
            case.expected.stage().name(),
            case.message
        ));
    }
    out
}

/// Parses the bytes, then loads them as a llama model.
fn read(bytes: Vec<u8>) -> Outcome {
    match GgufFile::from_bytes(bytes) {
        Err(error) => Outcome::Parse(error),
        Ok(file) => match Llama::from_file(file) {
            Err(error) => Outcome::Llama(error),
            Ok(_) => Outcome::Loaded,
        },
    }
}

#[test]
fn committed_files_are_what_the_recipes_write() {
    let dir = hostile_dir();
    let cases = cases();
    if std::env::var_os("LM_HOSTILE_UPDATE").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for case in &cases {
            std::fs::write(dir.join(case.file), &case.bytes).unwrap();
        }
        std::fs::write(dir.join(MANIFEST), manifest(&cases)).unwrap();
    }
    let update = "LM_HOSTILE_UPDATE=1 cargo test -p lm-model --test tests hostile_gguf";
    for case in &cases {
        let committed = std::fs::read(dir.join(case.file))
            .unwrap_or_else(|e| panic!("{}: {e}; run `{update}`", case.file));
        assert!(
            committed == case.bytes,
            "{} differs from its recipe; run `{update}`",
            case.file
        );
    }
    let listed: BTreeSet<String> = cases.iter().map(|c| c.file.to_owned()).collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".gguf"))
        .collect();
    assert_eq!(
        on_disk, listed,
        "files without a recipe, or recipes without a file"
    );
    let committed_manifest = std::fs::read_to_string(dir.join(MANIFEST)).unwrap();
    assert_eq!(committed_manifest, manifest(&cases), "run `{update}`");
}

#[test]
fn every_hostile_file_is_refused_with_the_error_that_names_it() {
    let dir = hostile_dir();
    for case in cases() {
        let bytes = std::fs::read(dir.join(case.file)).unwrap();
        let n_bytes = bytes.len();
        let outcome = read(bytes);
        assert!(
            case.expected.accepts(&outcome),
            "{}: got {outcome:?}",
            case.file
        );
        let message = match &outcome {
            Outcome::Parse(error) => error.to_string(),
            Outcome::Llama(error) => error.to_string(),
            // Tokenizer cases load as models; lm-cli's test checks their message.
            Outcome::Loaded => continue,
        };
        assert!(
            message.contains(case.message),
            "{}: message {message:?} lacks {:?}",
            case.file,
            case.message
        );
        assert!(!message.contains('\n'), "{}: {message:?}", case.file);
        assert!(n_bytes < 4096, "{} is not tiny", case.file);
    }
}

#[test]
fn stages_agree_with_the_outcomes() {
    // A parse case must fail to parse, a llama case must parse and fail to
    // load, tokenizer and valid cases must load.
    for case in cases() {
        let outcome = read(case.bytes);
        let stage = match outcome {
            Outcome::Parse(_) => Stage::Parse,
            Outcome::Llama(_) => Stage::Llama,
            Outcome::Loaded => {
                if case.expected.stage() == Stage::Valid {
                    Stage::Valid
                } else {
                    Stage::Tokenizer
                }
            }
        };
        assert_eq!(stage, case.expected.stage(), "{}", case.file);
    }
}

#[test]
fn every_truncation_of_the_valid_model_is_an_error_never_a_panic() {
    let bytes = tiny_llama().bytes();
    for len in 0..bytes.len() {
        let outcome = read(bytes[..len].to_vec());
        assert!(
            !matches!(outcome, Outcome::Loaded),
            "the first {len} bytes loaded"
        );
    }
}
