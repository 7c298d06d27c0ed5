//! Our logits over every prompt row against llama.cpp's and the exact
//! float64 rows written by `scripts/reference/all_rows.py`: the mean and
//! median KL(exact || ours) and KL(exact || llama.cpp) over the rows, how
//! many rows we are the farther one, and the last row's distances (the one
//! the conformance fixtures keep). `EXP_KV=f32` runs with an F32 KV cache.
//!
//! ```text
//! cargo run --example rows_vs_exact -p lm -- MODEL.gguf OUTPREFIX [llama|llama_f32]
//! ```
use lm::lm_core::{LanguageModel, Rows};

fn read_f32(path: &str) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    let norm = max + sum.ln();
    row.iter().map(|&v| f64::from(v) - norm).collect()
}

fn kl(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs()))
        .fold(0.0, f64::max)
}

/// The whole numbers of the array `meta[key]`.
fn numbers<'a>(meta: &'a serde_json::Value, key: &str) -> impl Iterator<Item = u64> + 'a {
    let array = meta[key].as_array().unwrap();
    array.iter().map(|v| v.as_u64().unwrap())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo xtask examples` runs every example without arguments.
    let (Some(model_path), Some(prefix)) = (args.get(1), args.get(2)) else {
        eprintln!(
            "skipped: needs a model and the rows of scripts/reference/all_rows.py \
             (rows_vs_exact MODEL.gguf OUTPREFIX [llama|llama_f32])"
        );
        return;
    };
    let llama_suffix = args.get(3).map_or("llama", |s| s.as_str());
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{prefix}.json")).unwrap()).unwrap();
    let ids: Vec<u32> = numbers(&meta, "ids").map(|n| n as u32).collect();
    let rows: Vec<usize> = numbers(&meta, "rows").map(|n| n as usize).collect();
    let vocab = meta["vocab"].as_u64().unwrap() as usize;
    let llama = read_f32(&format!("{prefix}.{llama_suffix}.f32"));
    let exact = read_f32(&format!("{prefix}.exact.f32"));
    let mut model = lm::load_gguf(model_path).unwrap();
    if std::env::var("EXP_KV").as_deref() == Ok("f32") {
        model.decoder = model
            .decoder
            .with_kv_precision(lm::lm_model::KvPrecision::F32);
    }
    let decoder = &model.decoder;
    let mut state = decoder.new_state();
    let mut ours_all = Vec::new();
    decoder
        .forward(&mut state, &ids, Rows::All, &mut ours_all)
        .unwrap();
    let (mut kl_ours, mut kl_llama, mut kl_between, mut farther) =
        (Vec::new(), Vec::new(), Vec::new(), 0);
    let (mut ma_ours, mut ma_llama) = (0.0, 0.0);
    for (i, &row) in rows.iter().enumerate() {
        let ours = &ours_all[row * vocab..(row + 1) * vocab];
        let theirs = &llama[i * vocab..(i + 1) * vocab];
        let ex = &exact[i * vocab..(i + 1) * vocab];
        let (a, b) = (kl(ex, ours), kl(ex, theirs));
        kl_ours.push(a);
        kl_llama.push(b);
        kl_between.push(kl(theirs, ours));
        if a > b {
            farther += 1;
        }
        ma_ours += max_abs(ours, ex);
        ma_llama += max_abs(theirs, ex);
    }
    let n = rows.len() as f64;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let median = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    let last = rows.len() - 1;
    println!(
        "{prefix} rows {}: KL(exact||ours) mean {:.5} median {:.5} | KL(exact||llama) mean {:.5} median {:.5} | ours farther in {farther}/{} | KL(llama||ours) mean {:.5} | mean max|.-exact| ours {:.3} llama {:.3} | last row: ours {:.3}/{:.5}, llama {:.3}/{:.5}",
        rows.len(),
        mean(&kl_ours),
        median(&kl_ours),
        mean(&kl_llama),
        median(&kl_llama),
        rows.len(),
        mean(&kl_between),
        ma_ours / n,
        ma_llama / n,
        max_abs(
            &ours_all[rows[last] * vocab..(rows[last] + 1) * vocab],
            &exact[last * vocab..]
        ),
        kl_ours[last],
        max_abs(&llama[last * vocab..], &exact[last * vocab..]),
        kl_llama[last],
    );
}
