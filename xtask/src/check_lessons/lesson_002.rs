//! Lesson 002, the encyclopedia article "Autoregressive text generation":
//! softmax over a GPT-2-sized vocabulary, temperature, greedy, beam search
//! with the GNMT length penalty, top-k, top-p, the order temperature then
//! filters, cross-entropy as KL from the one-hot target, label smoothing.
//!
//! Entropies come from the project's `kl_divergence`:
//! `H(p) = ln V - KL(p || uniform)`.

use anyhow::{Context, Result};
use lm_core::{argmax, cross_entropy, kl_divergence, label_smoothed_target, perplexity, softmax};
use lm_decode::{
    BeamConfig, Sampler, SamplingConfig, TokenRng, beam_search, enumerate_continuations,
    length_penalized_score,
};
use lm_model::Toy;

use super::toy_runs::{self, words};
use super::{Claim, fixed};

const LESSON: &str = "002";
const TO_DISTRIBUTION: &str = "From final vector to probability distribution";
const TEMPERATURE: &str = "Temperature and sampling";
const DECODING: &str = "Decoding strategies";
const TRAINING: &str = "Training objective and loss";

/// GPT-2's vocabulary size, the article's "~50,257 raw scores".
const GPT2_VOCAB: usize = 50_257;

/// Every claim of lesson 002.
pub(crate) fn claims() -> Result<Vec<Claim>> {
    let logits = random_logits(GPT2_VOCAB, 2002);
    let mut claims = softmax_and_temperature(&logits)?;
    claims.extend(decoding(&logits)?);
    claims.extend(training()?);
    Ok(claims)
}

fn claim(section: &'static str, text: &str) -> Claim {
    Claim::new(LESSON, section, text)
}

/// `n` logits uniform in [-10, 10) from the project's seeded generator.
fn random_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = TokenRng::new(seed);
    (0..n)
        .map(|_| (rng.next_uniform() * 20.0 - 10.0) as f32)
        .collect()
}

/// Entropy in nats through the project's KL divergence from the uniform.
fn entropy(p: &[f32]) -> Result<f64> {
    let uniform = vec![1.0 / p.len() as f32; p.len()];
    Ok((p.len() as f64).ln() - kl_divergence(p, &uniform)?)
}

fn softmax_and_temperature(logits: &[f32]) -> Result<Vec<Claim>> {
    let mut claims = Vec::new();
    let p = softmax(logits, 1.0)?;
    let sum: f64 = p.iter().map(|&x| f64::from(x)).sum();
    let in_range = p.iter().all(|&x| x > 0.0 && x < 1.0);
    claims.push(
        claim(
            TO_DISTRIBUTION,
            "softmax of 50,257 random logits: each in (0, 1), sum 1",
        )
        .quote("mapping 12,288 dimensions onto ~50,257 raw scores called logits")
        .quote("The result is a vector of probabilities between 0 and 1 that sum exactly to 1.")
        .check(
            "sum 1 (to 1e-5), every p in (0, 1)",
            format!(
                "{} probabilities, sum {sum:.7}, all in (0, 1): {in_range}",
                p.len()
            ),
            p.len() == GPT2_VOCAB && (sum - 1.0).abs() < 1e-5 && in_range,
        ),
    );
    let min = p.iter().copied().fold(f32::INFINITY, f32::min);
    claims.push(
        claim(
            TO_DISTRIBUTION,
            "exponentiation makes every probability positive (logits down to -10)",
        )
        .quote("each logit x_i is exponentiated (ensuring positivity)")
        .check("min p > 0", format!("min p = {min:.3e}"), min > 0.0),
    );
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let mut kept = Vec::new();
    for t in [0.5f32, 2.0] {
        let pt = softmax(logits, t)?;
        kept.push(order.windows(2).all(|w| pt[w[0]] >= pt[w[1]]));
    }
    claims.push(
        claim(
            TEMPERATURE,
            "dividing by T keeps the order of all 50,257 tokens (T = 0.5, 2)",
        )
        .quote("Temperature T modifies the softmax by dividing all logits before exponentiation")
        .check(
            "probabilities sorted as the logits",
            format!("order kept at T = 0.5: {}, T = 2: {}", kept[0], kept[1]),
            kept.iter().all(|&k| k),
        ),
    );
    let small = [2.0f32, 1.0, 0.0];
    let mut tops = Vec::new();
    for t in [1.0f32, 0.5, 0.1, 0.01] {
        tops.push(softmax(&small, t)?[0]);
    }
    claims.push(
        claim(TEMPERATURE, "low T peaks on the top token: logits (2, 1, 0), T = 1, 0.5, 0.1, 0.01")
            .quote("Low T (→ 0): Differences between logits are amplified; the distribution peaks sharply on the top token.")
            .check(
                "top share rises towards 1",
                fixed(&tops, 5),
                tops.windows(2).all(|w| w[1] > w[0]) && tops[3] > 0.99999,
            ),
    );
    let mut sampler = Sampler::new(&SamplingConfig::default())?;
    let policy = sampler.policy(logits, &[])?.to_vec();
    let max_rel = policy
        .iter()
        .zip(&p)
        .map(|(a, b)| ((a - b) / b).abs())
        .fold(0f32, f32::max);
    claims.push(
        claim(
            TEMPERATURE,
            "T = 1 leaves the model's distribution: sampler policy = softmax",
        )
        .quote("T = 1: The distribution is exactly what training produced — the baseline.")
        .check(
            "equal (relative 1e-6)",
            format!(
                "max relative diff {max_rel:.1e} over {} tokens",
                policy.len()
            ),
            max_rel < 1e-6,
        ),
    );
    let mut entropies = Vec::new();
    for t in [0.25f32, 0.5, 1.0, 2.0, 4.0] {
        entropies.push(entropy(&softmax(logits, t)?)?);
    }
    claims.push(
        claim(TEMPERATURE, "high T flattens: entropy rises with T (50,257 logits, T = 0.25 .. 4)")
            .quote("High T (> 1): Logit differences are compressed; the distribution flattens, giving lower-ranked tokens a realistic chance.")
            .check(
                format!("increasing, below ln V = {:.3}", (GPT2_VOCAB as f64).ln()),
                entropies.iter().map(|h| format!("{h:.3}")).collect::<Vec<_>>().join(" < "),
                entropies.windows(2).all(|w| w[1] > w[0])
                    && entropies.iter().all(|&h| h < (GPT2_VOCAB as f64).ln()),
            ),
    );
    Ok(claims)
}

fn decoding(logits: &[f32]) -> Result<Vec<Claim>> {
    let mut claims = Vec::new();
    let mut greedy = Sampler::new(&SamplingConfig::greedy())?;
    let picked = greedy.select(logits, &[], 0.5)?.token;
    let p = softmax(logits, 1.0)?;
    let most_probable = argmax(&p)?;
    claims.push(
        claim(DECODING, "greedy picks the most probable of 50,257 tokens")
            .quote("Greedy decoding always picks the single most probable next token")
            .exact(
                format!("token {most_probable} (argmax of p)"),
                format!("token {picked} (argmax of p)"),
            ),
    );
    let beam_default = BeamConfig::default();
    claims.push(
        claim(
            DECODING,
            "beam search defaults: beam size and length penalty",
        )
        .quote("used beam size 4 with length penalty α = 0.6")
        .exact(
            "B = 4, alpha = 0.6",
            format!(
                "B = {}, alpha = {}",
                beam_default.num_beams, beam_default.length_penalty
            ),
        ),
    );
    // Hand-computed GNMT penalty for |Y| = 10, alpha = 0.6:
    // ((5 + 10) / 6)^0.6 = 2.5^0.6 = exp(0.6 × ln 2.5) = exp(0.6 × 0.9162907)
    // = exp(0.5497744) = 1.7328621, so -3 / 1.7328621 = -1.7312399.
    // For |Y| = 1 the penalty is (6 / 6)^0.6 = 1.
    let ten = length_penalized_score(-3.0, 10, 0.6);
    let one = length_penalized_score(-3.0, 1, 0.6);
    claims.push(
        claim(
            DECODING,
            "length penalty ((5 + |Y|) / 6)^alpha: ln p = -3 at |Y| = 10 and 1, alpha 0.6",
        )
        .quote("used beam size 4 with length penalty α = 0.6")
        .exact("-1.731240, -3.000000", format!("{ten:.6}, {one:.6}")),
    );
    let toy = Toy::decoder();
    let prompt = toy_runs::prompt()?;
    let beams = beam_search(
        &toy,
        &prompt,
        &BeamConfig {
            max_new_tokens: 3,
            length_penalty: 0.0,
            ..BeamConfig::default()
        },
    )?;
    let all = enumerate_continuations(&toy, &prompt, 3, 10_000)?;
    let consistent = beams.iter().all(|h| {
        all.continuations
            .iter()
            .find(|c| c.tokens == h.tokens)
            .is_some_and(|c| (c.logprob - h.logprob).abs() < 1e-5)
    });
    let sorted = beams.windows(2).all(|w| w[0].logprob >= w[1].logprob);
    let top_four: Vec<&Vec<u32>> = all
        .continuations
        .iter()
        .take(4)
        .map(|c| &c.tokens)
        .collect();
    let beam_tokens: Vec<&Vec<u32>> = beams.iter().map(|h| &h.tokens).collect();
    claims.push(
        claim(
            DECODING,
            "beam search keeps the k = 4 most probable sequences (toy, 3 tokens, alpha 0)",
        )
        .quote("extending each, and keeping only the k most probable combined sequences")
        .check(
            "4 hypotheses, best first, scored by the chain rule",
            format!(
                "{} hypotheses: {}; = the 4 best of 343: {}",
                beams.len(),
                beams
                    .iter()
                    .map(|h| format!("`{}`", words(&h.tokens)))
                    .collect::<Vec<_>>()
                    .join(", "),
                beam_tokens == top_four
            ),
            beams.len() == 4 && consistent && sorted,
        ),
    );
    let k = 40;
    let mut top_k = Sampler::new(&SamplingConfig {
        top_k: Some(k),
        ..SamplingConfig::default()
    })?;
    let kept = top_k.policy(logits, &[])?;
    let kept_ids: Vec<usize> = (0..kept.len()).filter(|&i| kept[i] > 0.0).collect();
    let lowest_kept = kept_ids
        .iter()
        .map(|&i| logits[i])
        .fold(f32::INFINITY, f32::min);
    let highest_dropped = (0..logits.len())
        .filter(|&i| kept[i] == 0.0)
        .map(|i| logits[i])
        .fold(f32::NEG_INFINITY, f32::max);
    claims.push(
        claim(DECODING, "top-k keeps exactly the k highest (k = 40 of 50,257)")
            .quote("Top-k sampling limits candidates to the k tokens with highest probability")
            .check(
                "40 kept, none below a dropped one",
                format!("{} kept; lowest kept logit {lowest_kept:.4} > highest dropped {highest_dropped:.4}", kept_ids.len()),
                kept_ids.len() == k && lowest_kept > highest_dropped,
            ),
    );
    let nucleus = |probs: &[f32], p: f32, temperature: f32| -> Result<Vec<f32>> {
        let logits: Vec<f32> = probs.iter().map(|x| x.ln()).collect();
        let mut sampler = Sampler::new(&SamplingConfig {
            temperature,
            top_p: Some(p),
            ..SamplingConfig::default()
        })?;
        Ok(sampler.policy(&logits, &[])?.to_vec())
    };
    // Hand-computed: cumulative 0.5, 0.8, 0.95, so the smallest set reaching
    // 0.9 is the first three; renormalised by 0.95: 0.5263, 0.3158, 0.1579.
    let hand = nucleus(&[0.5, 0.3, 0.15, 0.05], 0.9, 1.0)?;
    claims.push(
        claim(DECODING, "top-p 0.9 on (0.5, 0.3, 0.15, 0.05): smallest set reaching 0.9, renormalised")
            .quote("Top-p (nucleus) sampling instead selects the smallest set of tokens whose cumulative probability mass exceeds a threshold p (e.g., p = 0.9), then samples from that set.")
            .exact("0.5263 0.3158 0.1579 0.0000", fixed(&hand, 4)),
    );
    let boundary = nucleus(&[0.5, 0.4, 0.1], 0.9, 1.0)?;
    let n_boundary = boundary.iter().filter(|&&x| x > 0.0).count();
    claims.push(
        claim(DECODING, "top-p when the mass equals p exactly: (0.5, 0.4, 0.1), p = 0.9")
            .quote("whose cumulative probability mass exceeds a threshold p")
            .check("2 tokens (mass reaches 0.9)", format!("{n_boundary} tokens: {}", fixed(&boundary, 4)), n_boundary == 2)
            .note("the sampler keeps the smallest set whose mass reaches p (Holtzman et al., HF, llama.cpp); a strict 'exceeds' would keep 3 here; the two differ only at exact equality"),
    );
    let confident = softmax(&[6.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 1.0)?;
    let uncertain = [0.1f32; 10];
    let n_confident = nucleus(&confident, 0.9, 1.0)?
        .iter()
        .filter(|&&x| x > 0.0)
        .count();
    let n_uncertain = nucleus(&uncertain, 0.9, 1.0)?
        .iter()
        .filter(|&&x| x > 0.0)
        .count();
    claims.push(
        claim(DECODING, "top-p 0.9 adapts: peaked (top 0.978) vs flat (10 × 0.1)")
            .quote("when the model is confident, the top few tokens may exceed the threshold; when uncertain, more candidates are included.")
            .exact("confident 1 token, uncertain 9 tokens", format!("confident {n_confident} token, uncertain {n_uncertain} tokens")),
    );
    let lesson_logits = [2.0f32, 1.0, 0.0];
    let probs_at_one = softmax(&lesson_logits, 1.0)?;
    let after_temperature = nucleus(&probs_at_one, 0.9, 2.0)?;
    let before_temperature = nucleus(&probs_at_one, 0.9, 1.0)?;
    let count = |p: &[f32]| p.iter().filter(|&&x| x > 0.0).count();
    claims.push(
        claim(DECODING, "order matters: logits (2, 1, 0), T = 2, top-p 0.9")
            .quote("A common configuration applies temperature first (reshaping the distribution) then applies top-k or top-p filtering before the final sample.")
            .check(
                "temperature first keeps 3; filtering at T = 1 first would keep 2",
                format!(
                    "temperature first: {} kept ({}); filter first: {} kept",
                    count(&after_temperature),
                    fixed(&after_temperature, 3),
                    count(&before_temperature)
                ),
                count(&after_temperature) == 3 && count(&before_temperature) == 2,
            ),
    );
    let chain = Sampler::new(&SamplingConfig {
        temperature: 0.7,
        top_k: Some(40),
        top_p: Some(0.9),
        ..SamplingConfig::default()
    })?;
    claims.push(
        claim(DECODING, "the sampler's chain order, as its Debug prints it")
            .quote("applies temperature first (reshaping the distribution) then applies top-k or top-p filtering")
            .exact(
                "[Temperature(0.7), TopK(40), TopP(0.9)]",
                format!("{chain:?}")
                    .split("chain: ")
                    .nth(1)
                    .and_then(|rest| rest.split(", selector").next())
                    .context("the sampler's Debug names its chain")?,
            ),
    );
    Ok(claims)
}

fn training() -> Result<Vec<Claim>> {
    let mut claims = Vec::new();
    let logits = [2.0f32, 1.0, 0.0];
    let q = softmax(&logits, 1.0)?;
    let one_hot = [1.0f32, 0.0, 0.0];
    let ce = cross_entropy(&logits, 0, 0.0)?;
    let kl = kl_divergence(&one_hot, &q)?;
    // Hand-computed: -ln 0.665241 = 0.407606.
    claims.push(
        claim(TRAINING, "cross-entropy = KL from the one-hot target: logits (2, 1, 0), target 0")
            .quote("cross-entropy loss (or equivalently, Kullback–Leibler divergence from the one-hot target)")
            .exact("CE 0.407606 = KL 0.407606 (= -ln 0.665241)", format!("CE {ce:.6} = KL {kl:.6} (= -ln {:.6})", q[0])),
    );
    let h_one_hot = entropy(&one_hot)?;
    claims.push(
        claim(TRAINING, "the one-hot target has entropy 0, so CE - KL = 0")
            .quote("(or equivalently, Kullback–Leibler divergence from the one-hot target)")
            .check(
                "H(one-hot) = 0",
                format!("H = {h_one_hot:.1e}; CE - KL = {:.1e}", ce - kl),
                // The uniform reference 1/3 is an f32: H is 0 to about 1e-7.
                h_one_hot.abs() < 1e-6 && (ce - kl).abs() < 1e-6,
            ),
    );
    let target = label_smoothed_target(4, 0, 0.1)?;
    claims.push(
        claim(TRAINING, "label smoothing eps = 0.1 over 4 tokens, target 0")
            .quote("Label smoothing (ε = 0.1 in the original Transformer) slightly redistributes probability away from the one-hot target")
            .exact(
                "0.925 0.025 0.025 0.025",
                target.iter().map(|t| format!("{t:.3}")).collect::<Vec<_>>().join(" "),
            ),
    );
    // Hand-computed for logits (10, 0, 0, 0), target 0:
    // plain CE = ln(1 + 3e^-10) = 0.000136; smoothed CE = lse - sum_i t_i z_i
    // = (10 + 0.000136) - 0.925 × 10 = 0.750136.
    let confident = [10.0f32, 0.0, 0.0, 0.0];
    let plain = cross_entropy(&confident, 0, 0.0)?;
    let smoothed = cross_entropy(&confident, 0, 0.1)?;
    claims.push(
        claim(
            TRAINING,
            "smoothing raises the loss of a confident correct prediction: logits (10, 0, 0, 0)",
        )
        .quote("Label smoothing (ε = 0.1 in the original Transformer)")
        .exact(
            "plain 0.000136, smoothed 0.750136",
            format!("plain {plain:.6}, smoothed {smoothed:.6}"),
        ),
    );
    // The smoothed loss is lowest when the prediction is the smoothed target
    // itself; that prediction puts 0.925 on the correct token, so its
    // perplexity on the true labels is 1 / 0.925 = 1.081081 instead of ~1.
    let smoothed_logits: Vec<f32> = target.iter().map(|&t| (t as f32).ln()).collect();
    let best_smoothed = cross_entropy(&smoothed_logits, 0, 0.1)?;
    let p_correct = f64::from(softmax(&smoothed_logits, 1.0)?[0]);
    let ppl_smoothed = perplexity(&[p_correct.ln()])?;
    let ppl_confident = perplexity(&[-plain])?;
    claims.push(
        claim(TRAINING, "the smoothed optimum has higher perplexity on the true labels")
            .quote("improving generalization even though it increases perplexity")
            .check(
                "1.081081 (= 1/0.925) > 1.000136",
                format!(
                    "{ppl_smoothed:.6} > {ppl_confident:.6}; smoothed loss at the optimum {best_smoothed:.6} < {smoothed:.6}"
                ),
                format!("{ppl_smoothed:.6}") == "1.081081"
                    && format!("{ppl_confident:.6}") == "1.000136"
                    && best_smoothed < smoothed,
            ),
    );
    Ok(claims)
}
