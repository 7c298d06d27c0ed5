//! The cost of structured output per token: llguidance's mask and advance
//! along a fixed JSON answer, over SmolLM2's 49,152-token vocabulary and
//! Gemma 3's 262,144 (the numbers in `docs/performance.md`), and compiling a
//! schema for each vocabulary. A model file that is missing is skipped with
//! a note (`cargo xtask fetch-model smollm2` / `gemma3-270m` fetch them).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lm::lm_core::{Constraint, TokenMask};
use lm::lm_model::catalog::{GEMMA3_270M, KnownModel, SMOLLM2};
use lm::{GgufText, OutputFormat};

const ANSWER: &str = "{\"name\": \"Ada Lovelace\", \"age\": 36, \"tags\": [\"math\", \"poetry\"], \"address\": {\"city\": \"London\", \"zip\": \"W1\"}}";

fn format() -> OutputFormat {
    OutputFormat::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 12}},
            "address": {"type": "object", "properties": {
                "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[A-Z0-9]{2,8}$"}},
              "required": ["city"]}},
        "required": ["name", "age", "tags", "address"],
        "additionalProperties": false
    }))
}

fn bench_vocabulary(c: &mut Criterion, name: &str, model: &KnownModel) {
    let path = match model.path() {
        Ok(path) => path,
        Err(error) => {
            eprintln!("skipped {name}: {error}");
            return;
        }
    };
    let text = GgufText::open(path).expect("the tokenizer builds");
    let vocab_size = text.tokenizer.vocab_size();
    let answer = text.tokenizer.encode_literal(ANSWER).unwrap();
    // The answer without the bos token the tokenizer may add.
    let answer: Vec<u32> = answer
        .into_iter()
        .filter(|&id| Some(id) != text.tokenizer.bos_id())
        .collect();
    let format = format();
    let constraint = text.structured_output(&format, vocab_size).unwrap();
    let mut group = c.benchmark_group(format!("structured/{name}"));
    group.sample_size(20);
    group.throughput(Throughput::Elements(answer.len() as u64));
    let mut mask = TokenMask::new(vocab_size);
    group.bench_function("mask_and_advance_per_answer", |b| {
        b.iter(|| {
            let mut state = constraint.start().unwrap();
            for &token in &answer {
                state.fill_allowed(&mut mask).unwrap();
                assert!(mask.is_allowed(token), "the answer is valid");
                state.advance(token).unwrap();
            }
            black_box(state.is_accepting().unwrap())
        });
    });
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.bench_function("compile", |b| {
        b.iter(|| black_box(text.structured_output(&format, vocab_size).unwrap()));
    });
    group.finish();
}

fn structured(c: &mut Criterion) {
    bench_vocabulary(c, "smollm2", &SMOLLM2);
    bench_vocabulary(c, "gemma3", &GEMMA3_270M);
}

criterion_group!(benches, structured);
criterion_main!(benches);
