//! Conformance with llama.cpp on SmolLM2-135M-Instruct Q4_1: the committed
//! reference fixtures in `fixtures/smollm2/` (written by
//! `scripts/reference/llama_cpp_reference.py` from llama-cpp-python; the
//! format is in that folder's README) against this crate's llama backend.
//!
//! For every greedy case:
//! - greedy continuations are identical up to the first step where
//!   llama.cpp's own top-1/top-2 gap is below [`TIE_GAP`] (near-ties may go
//!   either way between two correct implementations; see SMOLLM2.md);
//! - teacher-forced along llama.cpp's ids, our top-1 is llama.cpp's at every
//!   step whose gap is at least [`TIE_GAP`];
//! - at the last prompt position, every logit is within [`LOGIT_TOLERANCE`]
//!   of llama.cpp's, the KL divergence from llama.cpp's distribution is below
//!   [`MAX_KL`], and the chosen token's log-probability is within
//!   [`LOGPROB_TOLERANCE`] nats.
//!
//! Needs the model file (under `$LM_MODELS_DIR`, default
//! `$HOME/.cache/lm/models`); prints a skip message and returns without it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lm_core::{LanguageModel, Rows, TokenId, argmax, kl_divergence, log_softmax, softmax};
use lm_model::transformer::Llama;

const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Below this top-1/top-2 logit gap, a step is a near-tie.
const TIE_GAP: f32 = 0.3;
/// Largest allowed difference of one logit.
const LOGIT_TOLERANCE: f32 = 1.0;
/// Largest allowed KL divergence at the last prompt position.
const MAX_KL: f64 = 1e-2;
/// Largest allowed difference of a log-probability, in nats.
const LOGPROB_TOLERANCE: f64 = 0.25;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/smollm2")
}

fn model_path() -> Option<PathBuf> {
    let dir = std::env::var_os("LM_MODELS_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/lm/models"))
        })?;
    Some(dir.join(FILE_NAME)).filter(|path| path.exists())
}

#[test]
fn llama_cpp_conformance() {
    let greedy_path = fixtures_dir().join("greedy.json");
    let Ok(text) = std::fs::read_to_string(&greedy_path) else {
        eprintln!("SKIPPED llama_cpp_conformance: {greedy_path:?} not found");
        return;
    };
    let Some(path) = model_path() else {
        eprintln!(
            "SKIPPED llama_cpp_conformance: {FILE_NAME} not found under $LM_MODELS_DIR or ~/.cache/lm/models"
        );
        return;
    };
    let model = Llama::from_gguf(path).unwrap();
    let fixture = Json::parse(&text).unwrap();
    let cases = fixture.get("cases").as_array();
    assert!(!cases.is_empty());
    for case in cases {
        check_case(&model, case);
    }
}

fn check_case(model: &Llama, case: &Json) {
    let name = case.get("name").as_str();
    let prompt = case.get("prompt_ids").as_ids();
    let expected = case.get("continuation_ids").as_ids();
    let gaps = case.get("top1_minus_top2").as_f32s();
    assert_eq!(expected.len(), gaps.len(), "{name}: one gap per step");

    let mut prefilled = model.new_state();
    let mut last = Vec::new();
    model
        .forward(&mut prefilled, &prompt, Rows::Last, &mut last)
        .unwrap();
    if let Some(file) = case
        .get_opt("last_logits")
        .and_then(|logits| logits.get_opt("file"))
    {
        check_last_logits(
            name,
            &last,
            &fixtures_dir().join(file.as_str()),
            expected[0],
        );
    }

    // Greedy: identical up to llama.cpp's first near-tie.
    let first_tie = gaps
        .iter()
        .position(|&gap| gap < TIE_GAP)
        .unwrap_or(expected.len());
    let mut state = prefilled.clone();
    let mut logits = last.clone();
    let mut ours = Vec::new();
    for step in 0..first_tie {
        let token = argmax(&logits).unwrap();
        ours.push(token);
        if step + 1 < first_tie {
            model
                .forward(&mut state, &[token], Rows::Last, &mut logits)
                .unwrap();
        }
    }
    assert_eq!(
        ours,
        expected[..first_tie],
        "{name}: greedy continuation differs before llama.cpp's first near-tie (step {first_tie})"
    );

    // Teacher forcing along llama.cpp's ids.
    let mut state = prefilled;
    let mut logits = last;
    for (step, (&token, &gap)) in expected.iter().zip(&gaps).enumerate() {
        if gap >= TIE_GAP {
            assert_eq!(
                argmax(&logits).unwrap(),
                token,
                "{name}: teacher-forced step {step}: llama.cpp's top-1 leads by {gap}"
            );
        }
        if step + 1 < expected.len() {
            model
                .forward(&mut state, &[token], Rows::Last, &mut logits)
                .unwrap();
        }
    }
    eprintln!(
        "{name}: greedy identical for the {first_tie} steps before llama.cpp's first near-tie; \
         top-1 agrees at the {} teacher-forced steps with a gap >= {TIE_GAP}",
        gaps.iter().filter(|&&gap| gap >= TIE_GAP).count()
    );
}

fn check_last_logits(name: &str, ours: &[f32], path: &Path, chosen: TokenId) {
    let bytes = std::fs::read(path).unwrap();
    let theirs: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(theirs.len(), ours.len(), "{name}: logits length");
    let (worst_idx, worst) = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold(
            (0, 0.0),
            |best, (i, d)| if d > best.1 { (i, d) } else { best },
        );
    assert!(
        worst < LOGIT_TOLERANCE,
        "{name}: logit {worst_idx} differs by {worst} from llama.cpp's"
    );
    let p = softmax(&theirs, 1.0).unwrap();
    let q = softmax(ours, 1.0).unwrap();
    let kl = kl_divergence(&p, &q).unwrap();
    assert!(kl < MAX_KL, "{name}: KL(llama.cpp || ours) = {kl}");
    let chosen_ours = f64::from(log_softmax(ours, 1.0).unwrap()[chosen as usize]);
    let chosen_theirs = f64::from(log_softmax(&theirs, 1.0).unwrap()[chosen as usize]);
    assert!(
        (chosen_ours - chosen_theirs).abs() < LOGPROB_TOLERANCE,
        "{name}: log p(chosen) {chosen_ours} vs llama.cpp {chosen_theirs}"
    );
    eprintln!(
        "{name}: last logits max diff {worst}, KL {kl:.2e}, log p(chosen) diff {:.3}",
        chosen_ours - chosen_theirs
    );
}

/// Just enough JSON to read the fixture (lm-model has no JSON dependency).
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

impl Json {
    fn parse(text: &str) -> Result<Json, String> {
        let mut parser = Parser {
            chars: text.chars().collect(),
            pos: 0,
        };
        let value = parser.value()?;
        parser.skip_whitespace();
        if parser.pos != parser.chars.len() {
            return Err(format!("trailing characters at {}", parser.pos));
        }
        Ok(value)
    }

    fn get(&self, key: &str) -> &Json {
        self.get_opt(key)
            .unwrap_or_else(|| panic!("fixture has no key {key:?}"))
    }

    fn get_opt(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(map) => map.get(key).filter(|v| **v != Json::Null),
            _ => None,
        }
    }

    fn as_array(&self) -> &[Json] {
        match self {
            Json::Array(items) => items,
            other => panic!("expected an array, found {other:?}"),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            Json::String(s) => s,
            other => panic!("expected a string, found {other:?}"),
        }
    }

    fn as_f64(&self) -> f64 {
        match self {
            Json::Number(v) => *v,
            other => panic!("expected a number, found {other:?}"),
        }
    }

    fn as_f32s(&self) -> Vec<f32> {
        self.as_array().iter().map(|v| v.as_f64() as f32).collect()
    }

    fn as_ids(&self) -> Vec<TokenId> {
        self.as_array()
            .iter()
            .map(|v| v.as_f64() as TokenId)
            .collect()
    }
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

impl Parser {
    fn skip_whitespace(&mut self) {
        while self.chars.get(self.pos).is_some_and(|c| c.is_whitespace()) {
            self.pos += 1;
        }
    }

    fn next(&mut self) -> Result<char, String> {
        let c = *self.chars.get(self.pos).ok_or("unexpected end")?;
        self.pos += 1;
        Ok(c)
    }

    fn expect(&mut self, word: &str) -> Result<(), String> {
        for expected in word.chars() {
            if self.next()? != expected {
                return Err(format!("expected {word:?} at {}", self.pos));
            }
        }
        Ok(())
    }

    fn value(&mut self) -> Result<Json, String> {
        self.skip_whitespace();
        match self.chars.get(self.pos).copied().ok_or("unexpected end")? {
            'n' => self.expect("null").map(|()| Json::Null),
            't' => self.expect("true").map(|()| Json::Bool(true)),
            'f' => self.expect("false").map(|()| Json::Bool(false)),
            '"' => self.string().map(Json::String),
            '[' => {
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    self.skip_whitespace();
                    if self.chars.get(self.pos) == Some(&']') {
                        self.pos += 1;
                        return Ok(Json::Array(items));
                    }
                    items.push(self.value()?);
                    self.skip_whitespace();
                    if self.chars.get(self.pos) == Some(&',') {
                        self.pos += 1;
                    }
                }
            }
            '{' => {
                self.pos += 1;
                let mut map = BTreeMap::new();
                loop {
                    self.skip_whitespace();
                    if self.chars.get(self.pos) == Some(&'}') {
                        self.pos += 1;
                        return Ok(Json::Object(map));
                    }
                    let key = self.string()?;
                    self.skip_whitespace();
                    self.expect(":")?;
                    map.insert(key, self.value()?);
                    self.skip_whitespace();
                    if self.chars.get(self.pos) == Some(&',') {
                        self.pos += 1;
                    }
                }
            }
            _ => {
                let start = self.pos;
                while self
                    .chars
                    .get(self.pos)
                    .is_some_and(|c| c.is_ascii_digit() || "+-.eE".contains(*c))
                {
                    self.pos += 1;
                }
                let number: String = self.chars[start..self.pos].iter().collect();
                number
                    .parse()
                    .map(Json::Number)
                    .map_err(|_| format!("bad number {number:?} at {start}"))
            }
        }
    }

    fn hex_unit(&mut self) -> Result<u32, String> {
        let hex: String = (0..4).map(|_| self.next()).collect::<Result<_, _>>()?;
        u32::from_str_radix(&hex, 16).map_err(|e| e.to_string())
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect("\"")?;
        let mut out = String::new();
        loop {
            match self.next()? {
                '"' => return Ok(out),
                '\\' => match self.next()? {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    'b' => out.push('\u{8}'),
                    'f' => out.push('\u{c}'),
                    'u' => {
                        let first = self.hex_unit()?;
                        let code = if (0xD800..0xDC00).contains(&first) {
                            self.expect("\\u")?;
                            let second = self.hex_unit()?;
                            0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                        } else {
                            first
                        };
                        out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                    }
                    other => out.push(other),
                },
                c => out.push(c),
            }
        }
    }
}

#[test]
fn the_json_reader_reads_what_the_fixture_uses() {
    let value =
        Json::parse(r#"{"a": [1, -2.5e1, true, null], "b": "x\"\u00e9\ud83c\udf55", "c": {}}"#)
            .unwrap();
    assert_eq!(value.get("a").as_array()[1].as_f64(), -25.0);
    assert_eq!(value.get("b").as_str(), "x\"é🍕");
    assert_eq!(value.get("a").as_array()[3], Json::Null);
    assert!(Json::parse("[1, 2").is_err());
}
