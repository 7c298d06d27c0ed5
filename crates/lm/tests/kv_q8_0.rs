//! An 8-bit KV cache against llama.cpp's: SmolLM2's conformance prompts
//! with our cache at q8_0 (`--kv-type q8_0`) through the conformance
//! harness, against llama.cpp run with `type_k = type_v = q8_0` (and flash
//! attention, which its quantized V cache needs), within the same
//! tolerances as every other fixture. The fixture, its exact twin and its
//! envelope (`fixtures/smollm2/kv_q8_0*.json`) are written by
//! `scripts/reference/llama_cpp_reference.py --conformance smollm2 --name
//! kv_q8_0 --kv-type q8_0`, then `exact_forward.py` and
//! `llama_cpp_envelope.py` with `kv_q8_0`.

use lm::lm_model::KvPrecision;
use lm::lm_model::catalog::SMOLLM2;

use crate::common::fixture_json;
use crate::conformance::check_model_with_kv;

const FIXTURE: &str = "smollm2/kv_q8_0.json";

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn smollm2_with_a_q8_0_cache_matches_llama_cpp_with_one() {
    check_model_with_kv(&SMOLLM2, FIXTURE, Some(KvPrecision::Q8_0));
}

#[test]
fn the_fixture_is_llama_cpp_with_a_q8_0_cache_on_the_catalog_file() {
    let json: serde_json::Value = fixture_json(FIXTURE);
    assert_eq!(json["model"]["sha256"], SMOLLM2.sha256);
    assert_eq!(json["settings"]["kv_cache_type"], "q8_0");
    assert_eq!(json["settings"]["flash_attn"], true);
}
