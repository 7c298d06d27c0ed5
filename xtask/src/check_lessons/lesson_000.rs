//! Lesson 000, "LM1-T2 Autoregressive Generation": softmax with temperature
//! on the logits (2, 1, 0) of "red", "green", "blue", inverse-CDF sampling,
//! the shift-by-the-max identity, the cost of generation, and the three
//! knowledge-check questions.
//!
//! Every probability comes from `lm_core::softmax` or the `lm_decode::Sampler`
//! users run; frequencies are counted from seeded draws of the sampler
//! (100,000 draws, tolerance 0.01: more than six standard deviations).
//! The cost claims count forward calls of the toy decoder through a wrapper.

use anyhow::{Context, Result};
use lm_core::{Counting, LanguageModel, Rows, TokenId, argmax, sample_inverse_cdf, softmax};
use lm_decode::{GenerationConfig, Sampler, SamplingConfig, TokenRng, generate};
use lm_model::{Decoder, Toy};

use super::{Claim, fixed};

const LESSON: &str = "000";
const DECODING: &str = "Choosing the token: decoding rules";
const MATH: &str = "The mathematics: logits, softmax and temperature";
const WORKED: &str = "A worked example: temperature on three logits";
const LOOP: &str = "The loop in Python";
const ENGINEERING: &str = "Engineering implications and limitations";
const QUESTION_1: &str = "Knowledge check, question 1";
const QUESTION_2: &str = "Knowledge check, question 2";
const QUESTION_3: &str = "Knowledge check, question 3";

/// The worked example's logits for "red", "green", "blue".
const LOGITS: [f32; 3] = [2.0, 1.0, 0.0];
const NAMES: [&str; 3] = ["red", "green", "blue"];
/// Seeded draws behind every frequency claim, and the tolerance on them.
const N_DRAWS: usize = 100_000;
const FREQUENCY_TOLERANCE: f64 = 0.01;
/// The explanation of question 1 rounds exp(1) to 2.718; its arithmetic is
/// checked with that rounded value on purpose.
#[allow(clippy::approx_constant)]
const ROUNDED_E: f64 = 2.718;

/// Every claim of lesson 000.
pub(crate) fn claims() -> Result<Vec<Claim>> {
    let mut claims = temperature_table()?;
    claims.extend(sampling_and_order()?);
    claims.extend(knowledge_check()?);
    claims.extend(cost_of_generation()?);
    Ok(claims)
}

fn claim(section: &'static str, text: &str) -> Claim {
    Claim::new(LESSON, section, text)
}

fn name(token: TokenId) -> &'static str {
    NAMES.get(token as usize).copied().unwrap_or("?")
}

/// The table, the exponentials and sums of the worked example, "87% instead of 67%".
fn temperature_table() -> Result<Vec<Claim>> {
    let mut claims = Vec::new();
    for (t, expected, quote) in [
        (
            0.5,
            "0.867 0.117 0.016",
            "| 0.5 | 0.867 | 0.117 | 0.016 | focused, close to greedy |",
        ),
        (
            1.0,
            "0.665 0.245 0.090",
            "| 1.0 | 0.665 | 0.245 | 0.090 | the model’s own distribution |",
        ),
        (
            2.0,
            "0.506 0.307 0.186",
            "| 2.0 | 0.506 | 0.307 | 0.186 | varied, more mistakes |",
        ),
    ] {
        let p = softmax(&LOGITS, t)?;
        claims.push(
            claim(
                WORKED,
                &format!("table row T = {t:.1}: p(red, green, blue), 3 decimals"),
            )
            .quote(quote)
            .exact(expected, fixed(&p, 3)),
        );
    }
    // exp(z_i / T) recovered from the project's softmax: blue's logit is 0, so
    // exp(z_blue / T) = 1, the sum is 1 / p_blue and exp(z_i / T) = p_i / p_blue.
    for (t, expected, quote) in [
        (
            0.5f32,
            "exp 54.60 7.389 1.000, sum 62.99",
            "At T = 0.5 the logits become (4, 2, 0): exp = (54.60, 7.389, 1.000), sum 62.99, so p = (0.867, 0.117, 0.016).",
        ),
        (
            2.0,
            "exp 2.718 1.649 1.000, sum 5.367",
            "At T = 2 the logits become (1, 0.5, 0): exp = (2.718, 1.649, 1.000), sum 5.367, so p = (0.506, 0.307, 0.186)",
        ),
    ] {
        let p = softmax(&LOGITS, t)?;
        let (red, green, blue) = (f64::from(p[0]), f64::from(p[1]), f64::from(p[2]));
        let sum = 1.0 / blue;
        // The lesson prints four significant digits.
        let computed = if t < 1.0 {
            format!(
                "exp {:.2} {:.3} {:.3}, sum {:.2}",
                red * sum,
                green * sum,
                blue * sum,
                sum
            )
        } else {
            format!(
                "exp {:.3} {:.3} {:.3}, sum {:.3}",
                red * sum,
                green * sum,
                blue * sum,
                sum
            )
        };
        claims.push(
            claim(
                WORKED,
                &format!("exp(z/T) and their sum at T = {t} (p_i / p_blue, 1 / p_blue)"),
            )
            .quote(quote)
            .exact(expected, computed),
        );
    }
    let sharp = softmax(&LOGITS, 0.5)?;
    let own = softmax(&LOGITS, 1.0)?;
    claims.push(
        claim(WORKED, "red's share at T = 0.5 vs T = 1, in percent")
            .quote("“red” is now chosen 87% of the time instead of 67%.")
            .exact(
                "87% instead of 67%",
                format!("{:.0}% instead of {:.0}%", sharp[0] * 100.0, own[0] * 100.0),
            ),
    );
    let red_freq = sampled_share(&LOGITS, 0.5, 0, N_DRAWS)?;
    claims.push(
        claim(
            WORKED,
            "red chosen 87% of the time: seeded sampler draws at T = 0.5",
        )
        .quote("“red” is now chosen 87% of the time")
        .check(
            format!("0.867 ± {FREQUENCY_TOLERANCE}"),
            format!("{red_freq:.4} ({N_DRAWS} draws, seed 0)"),
            (red_freq - f64::from(sharp[0])).abs() < FREQUENCY_TOLERANCE,
        ),
    );
    Ok(claims)
}

/// Greedy at every temperature, blue one time in five, a quarter of the
/// time, the order, sharpening, inverse CDF and the max-shift identity.
fn sampling_and_order() -> Result<Vec<Claim>> {
    let mut claims = Vec::new();
    let temperatures = [0.5f32, 1.0, 2.0];
    let mut greedy_picks = Vec::new();
    for t in temperatures {
        greedy_picks.push(name(argmax(&softmax(&LOGITS, t)?)?));
    }
    let mut greedy = Sampler::new(&SamplingConfig::greedy())?;
    let sampler_pick = name(greedy.select(&LOGITS, &[], 0.99)?.token);
    claims.push(
        claim(
            WORKED,
            "greedy picks red at T = 0.5, 1, 2 (argmax; the greedy sampler)",
        )
        .quote("Greedy decoding picks “red” at every temperature.")
        .exact(
            "red red red; sampler red",
            format!("{}; sampler {sampler_pick}", greedy_picks.join(" ")),
        ),
    );
    let hot = softmax(&LOGITS, 2.0)?;
    let blue = f64::from(hot[2]);
    claims.push(
        claim(WORKED, "blue's share at T = 2 is about one in five")
            .quote("Sampling at T = 2 picks “blue” about one time in five.")
            .check(
                "about 1/5 (within 0.02)",
                format!("{blue:.3} = 1/{:.1}", 1.0 / blue),
                (blue - 0.2).abs() < 0.02,
            ),
    );
    let blue_freq = sampled_share(&LOGITS, 2.0, 2, N_DRAWS)?;
    claims.push(
        claim(
            WORKED,
            "blue one time in five: seeded sampler draws at T = 2",
        )
        .quote("Sampling at T = 2 picks “blue” about one time in five.")
        .check(
            format!("0.186 ± {FREQUENCY_TOLERANCE}"),
            format!("{blue_freq:.4} ({N_DRAWS} draws, seed 0)"),
            (blue_freq - blue).abs() < FREQUENCY_TOLERANCE,
        ),
    );
    let quarter = [0.25f32.ln(), 0.75f32.ln()];
    let quarter_freq = sampled_share(&quarter, 1.0, 0, N_DRAWS)?;
    claims.push(
        claim(DECODING, "a 25% token is drawn about a quarter of the time")
            .quote("A token with 25% probability is chosen about a quarter of the time.")
            .check(
                format!("0.25 ± {FREQUENCY_TOLERANCE}"),
                format!("{quarter_freq:.4} ({N_DRAWS} draws, seed 0)"),
                (quarter_freq - 0.25).abs() < FREQUENCY_TOLERANCE,
            ),
    );
    let mut orders = Vec::new();
    for t in [0.1f32, 0.5, 1.0, 2.0, 10.0] {
        let p = softmax(&LOGITS, t)?;
        orders.push(p[0] > p[1] && p[1] > p[2]);
    }
    claims.push(
        claim(MATH, "dividing by T keeps the order (T = 0.1, 0.5, 1, 2, 10)")
            .quote("Dividing the logits by T does not change their order, so the most likely token stays most likely; only the gaps change.")
            .check(
                "red > green > blue at every T",
                format!(
                    "red > green > blue at {} of {} temperatures",
                    orders.iter().filter(|&&o| o).count(),
                    orders.len()
                ),
                orders.iter().all(|&o| o),
            ),
    );
    claims.push(
        claim(
            MATH,
            "T < 1 sharpens, T > 1 flattens: p(red) at T = 0.5, 1, 2",
        )
        .quote("T < 1 sharpens it (the most likely token gains); T > 1 flattens it")
        .check(
            "p(red) falls as T rises",
            format!(
                "{:.3} > {:.3} > {:.3}",
                softmax(&LOGITS, 0.5)?[0],
                softmax(&LOGITS, 1.0)?[0],
                hot[0]
            ),
            softmax(&LOGITS, 0.5)?[0] > softmax(&LOGITS, 1.0)?[0]
                && softmax(&LOGITS, 1.0)?[0] > hot[0],
        ),
    );
    // Running totals at T = 1: 0.665, 0.910 (0.665 + 0.245), 1.
    let own = softmax(&LOGITS, 1.0)?;
    let draws = [0.0, 0.664, 0.666, 0.909, 0.911, 0.999];
    let mut picks = Vec::new();
    let mut sampler = Sampler::new(&SamplingConfig::default())?;
    let mut sampler_agrees = true;
    for u in draws {
        let token = sample_inverse_cdf(&own, u)?;
        sampler_agrees &= sampler.select(&LOGITS, &[], u)?.token == token;
        picks.push(name(token));
    }
    claims.push(
        claim(MATH, "inverse CDF at T = 1, u = 0, .664, .666, .909, .911, .999")
            .quote("taking the first token at which the running total exceeds u (the inverse-CDF method of Lab LM1-L1)")
            .check(
                "red red green green blue blue (totals 0.665, 0.910)",
                format!(
                    "{} (sampler {})",
                    picks.join(" "),
                    if sampler_agrees { "agrees" } else { "DIFFERS" }
                ),
                picks == ["red", "red", "green", "green", "blue", "blue"] && sampler_agrees,
            ),
    );
    let shifted_down = softmax(&[0.0, -1.0, -2.0], 1.0)?;
    let shifted_up = softmax(&[1002.0, 1001.0, 1000.0], 1.0)?;
    claims.push(
        claim(LOOP, "the same probabilities for logits shifted by -2 and +1000")
            .quote("Subtracting the largest logit before exponentiating prevents overflow and does not change the result, because the common factor cancels in the ratio.")
            .check(
                "identical to (2, 1, 0): 0.665 0.245 0.090",
                format!(
                    "{} / {} (bitwise equal: {})",
                    fixed(&shifted_down, 3),
                    fixed(&shifted_up, 3),
                    shifted_down == own && shifted_up == own
                ),
                shifted_down == own && shifted_up == own,
            ),
    );
    let overflows = 1002f64.exp().is_infinite();
    claims.push(
        claim(
            LOOP,
            "exp(1002) overflows f64; softmax of (1002, 1001, 1000) stays finite",
        )
        .quote("# subtract the max: avoids overflow, same result")
        .check(
            "overflow avoided",
            format!(
                "exp(1002) = {}; softmax all finite: {}",
                1002f64.exp(),
                shifted_up.iter().all(|p| p.is_finite())
            ),
            overflows && shifted_up.iter().all(|p| p.is_finite()),
        ),
    );
    Ok(claims)
}

/// Questions 1 and 2 of the knowledge check.
fn knowledge_check() -> Result<Vec<Claim>> {
    let mut claims = Vec::new();
    let logits = [3.0f32, 1.0, 1.0];
    let p = softmax(&logits, 1.0)?;
    claims.push(
        claim(QUESTION_1, "softmax of (3, 1, 1) at T = 1, two decimals")
            .quote("Logits are (3, 1, 1). Compute the softmax probabilities at T = 1 (give two decimals).")
            .quote("0.79, 0.11, 0.11.")
            .exact("0.79 0.11 0.11", fixed(&p, 2)),
    );
    // The explanation's intermediates: exp(3), exp(1) and their sum. The sum
    // 25.53 adds the rounded terms (20.09 + 2 × 2.718 = 25.526); the unrounded
    // sum is 25.522.
    let (e3, e1) = (3f64.exp(), 1f64.exp());
    let rounded_terms_sum = 20.09 + 2.0 * ROUNDED_E;
    claims.push(
        claim(QUESTION_1, "intermediates exp(3), exp(1), their sum")
            .quote("exp(3) = 20.09, exp(1) = 2.718 twice; sum = 25.53.")
            .check(
                "20.09 2.718; sum 25.53",
                format!("{e3:.2} {e1:.3}; sum {:.2} (of the rounded terms {rounded_terms_sum:.2})", e3 + 2.0 * e1),
                format!("{e3:.2} {e1:.3}") == "20.09 2.718"
                    && format!("{rounded_terms_sum:.2}") == "25.53"
                    // and they are the project's softmax: p_1 = e / sum.
                    && (f64::from(p[1]) - e1 / (e3 + 2.0 * e1)).abs() < 1e-6,
            )
            .note(format!(
                "25.53 adds the rounded terms (20.09 + 2 × 2.718 = {rounded_terms_sum:.3}); unrounded e^3 + 2e = {:.3}",
                e3 + 2.0 * e1
            )),
    );
    // The explanation's third decimal divides the rounded 2.718 by the
    // rounded 25.53; unrounded, e / (e^3 + 2e) = 0.10651 rounds to 0.107.
    let from_rounded = [20.09 / 25.53, ROUNDED_E / 25.53, ROUNDED_E / 25.53].map(|x: f64| x as f32);
    claims.push(
        claim(QUESTION_1, "three decimals from the explanation")
            .quote("p = (0.787, 0.106, 0.106)")
            .check(
                "0.787 0.106 0.106",
                format!("{} (from 20.09/25.53, 2.718/25.53: {})", fixed(&p, 3), fixed(&from_rounded, 3)),
                fixed(&from_rounded, 3) == "0.787 0.106 0.106" && fixed(&p, 2) == "0.79 0.11 0.11",
            )
            .note(format!(
                "0.106 comes from rounded intermediates (2.718 / 25.53 = {:.5}); unrounded p = {:.4} rounds to 0.107; the two-decimal answer holds",
                ROUNDED_E / 25.53,
                p[1]
            )),
    );
    let third = 1.0f32 / 3.0;
    let warm = softmax(&logits, 1e6)?;
    let infinite = softmax(&logits, f32::INFINITY)?;
    let near_uniform = warm.iter().all(|&x| (x - third).abs() < 1e-5);
    claims.push(
        claim(QUESTION_2, "T large: uniform 1/V (T = 1e6 and T = +inf, V = 3)")
            .quote("As T grows, every z/T tends to 0, so all tokens approach probability 1/V (a uniform distribution).")
            .check(
                "1/3 each (0.33333)",
                format!("T = 1e6: {}; T = inf: {}", fixed(&warm, 5), fixed(&infinite, 5)),
                near_uniform && infinite.iter().all(|&x| (x - third).abs() < 1e-7),
            ),
    );
    let cold = softmax(&logits, 1e-6)?;
    let zero = softmax(&logits, 0.0)?;
    claims.push(
        claim(
            QUESTION_2,
            "T small: one-hot on the largest logit (T = 1e-6 and T = 0)",
        )
        .quote("As T tends to 0 the largest logit dominates and its probability tends to 1")
        .exact(
            "T = 1e-6: 1 0 0; T = 0: 1 0 0",
            format!("T = 1e-6: {}; T = 0: {}", fixed(&cold, 0), fixed(&zero, 0)),
        ),
    );
    let mut cold_sampler = Sampler::new(&SamplingConfig {
        temperature: 1e-6,
        ..SamplingConfig::default()
    })?;
    let mut greedy = Sampler::new(&SamplingConfig::greedy())?;
    let mut picks = Vec::new();
    for u in [0.0, 0.25, 0.5, 0.75, 0.999] {
        picks.push(cold_sampler.select(&logits, &[], u)?.token);
    }
    let greedy_pick = greedy.select(&logits, &[], 0.5)?.token;
    claims.push(
        claim(
            QUESTION_2,
            "sampling at T = 1e-6 picks what greedy picks, for any u",
        )
        .quote("sampling becomes greedy decoding")
        .check(
            format!("token {greedy_pick} (greedy) for every u"),
            format!("tokens {picks:?} for u = 0, .25, .5, .75, .999"),
            picks.iter().all(|&t| t == greedy_pick) && greedy.is_greedy(),
        ),
    );
    Ok(claims)
}

/// Model calls to generate `n_new` tokens greedily from the toy's prompt.
fn calls_for(model: &Counting<Decoder>, n_new: usize) -> Result<usize> {
    let prompt = Toy::encode("<start> the cat").map_err(|w| anyhow::anyhow!("unknown word {w}"))?;
    let config = GenerationConfig {
        max_new_tokens: n_new,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    };
    model.reset_counts();
    let run = generate(model, &prompt, &config, None)?;
    anyhow::ensure!(
        run.tokens.len() == n_new,
        "the toy generated {} tokens, not {n_new}",
        run.tokens.len()
    );
    Ok(model.n_calls())
}

/// m tokens need m calls, question 3, 500 vs 50 tokens, training in one pass.
fn cost_of_generation() -> Result<Vec<Claim>> {
    let mut claims = Vec::new();
    let toy = Toy::with_context_length(512).context("building the toy decoder")?;
    let model = Counting::new(toy);
    let counts: Vec<(usize, usize)> = [1usize, 5, 50]
        .into_iter()
        .map(|m| calls_for(&model, m).map(|calls| (m, calls)))
        .collect::<Result<_>>()?;
    claims.push(
        claim(MATH, "m new tokens need m sequential model calls (toy, m = 1, 5, 50)")
            .quote("Generating m new tokens needs m sequential model calls, because token t + 1 depends on token t.")
            .check(
                "calls = m",
                counts
                    .iter()
                    .map(|(m, calls)| format!("m = {m}: {calls} calls"))
                    .collect::<Vec<_>>()
                    .join(", "),
                counts.iter().all(|(m, calls)| m == calls),
            ),
    );
    let calls_200 = calls_for(&model, 200)?;
    let seconds = calls_200 as f64 * 20.0 / 1000.0;
    claims.push(
        claim(
            QUESTION_3,
            "200 tokens at 20 ms per forward pass (calls counted on the toy)",
        )
        .quote("200 × 20 ms = 4 seconds.")
        .exact("4 s", format!("{seconds} s"))
        .note(format!(
            "{calls_200} sequential calls counted for 200 tokens, × 20 ms"
        )),
    );
    let (calls_500, calls_50) = (calls_for(&model, 500)?, calls_for(&model, 50)?);
    let ratio = calls_500 as f64 / calls_50 as f64;
    claims.push(
        claim(
            ENGINEERING,
            "500 vs 50 tokens: ratio of sequential model calls (toy)",
        )
        .quote("a 500-token answer takes about 10 times as long as a 50-token one")
        .exact("10", format!("{ratio}"))
        .note(format!("{calls_500} / {calls_50} calls")),
    );
    // Training: one call reads a known text and returns every position's row.
    let toy = &model.inner;
    let text = Toy::encode("<start> the cat sat the dog slept <end>")
        .map_err(|w| anyhow::anyhow!("unknown word {w}"))?;
    let mut all = Vec::new();
    let mut state = toy.new_state();
    toy.forward(&mut state, &text, Rows::All, &mut all)?;
    let mut step_state = toy.new_state();
    let mut row = Vec::new();
    let mut max_diff = 0f32;
    for (index, &token) in text.iter().enumerate() {
        toy.forward(&mut step_state, &[token], Rows::Last, &mut row)?;
        let one_pass = all
            .get(index * row.len()..(index + 1) * row.len())
            .context("a row missing from the one-pass logits")?;
        for (a, b) in one_pass.iter().zip(&row) {
            max_diff = max_diff.max((a - b).abs());
        }
    }
    claims.push(
        claim(
            MATH,
            "one call predicts every position of a known text (toy, 8 tokens)",
        )
        .quote("all positions of a known text are predicted at once")
        .check(
            "8 rows from 1 call = the 8 step-by-step rows",
            format!(
                "{} rows; max |diff| {max_diff:.1e}",
                all.len() / row.len().max(1)
            ),
            all.len() == text.len() * row.len() && max_diff < 1e-5,
        ),
    );
    Ok(claims)
}

/// The share of `token` among `N_DRAWS` seeded draws of the sampler at
/// `temperature` (seed 0, the lesson's "fix the seed").
fn sampled_share(logits: &[f32], temperature: f32, token: TokenId, n_draws: usize) -> Result<f64> {
    let config = SamplingConfig {
        temperature,
        ..SamplingConfig::default()
    };
    let mut sampler = Sampler::new(&config)?;
    let mut rng = TokenRng::new(config.seed);
    let mut hits = 0usize;
    for _ in 0..n_draws {
        if sampler.select(logits, &[], rng.next_uniform())?.token == token {
            hits += 1;
        }
    }
    Ok(hits as f64 / n_draws as f64)
}
