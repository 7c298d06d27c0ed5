//! `lm-cli generate` on the toy decoder and the default model: JSON fields,
//! the trace table, stop reasons, beams, sequences and determinism, checked
//! against the toy decoder's uncached reference path computed here, with the
//! outputs scripts read pinned by snapshots.

use lm_core::TokenId;
use lm_model::Toy;

use crate::common::{Cli, assert_contains, check, ids};
use crate::toy_reference::next_logprobs;

fn argmax(values: &[f64]) -> TokenId {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as TokenId
}

/// The ids a `--json` step read: the prompt and the first `prefix_len -
/// prompt length` generated ids.
fn prefix_of(report: &serde_json::Value, step: &serde_json::Value) -> Vec<u32> {
    let prompt = ids(&report["prompt_ids"]);
    let n_generated = step["prefix_len"].as_u64().unwrap() as usize - prompt.len();
    [prompt, ids(&report["ids"])[..n_generated].to_vec()].concat()
}

/// `generate` on the toy decoder, greedy, `n` new tokens.
fn toy_greedy(n: usize) -> Cli {
    Cli::toy("generate").n(n).arg("--greedy")
}

#[test]
fn greedy_json_has_growing_prefixes_and_the_chain_rule_total() {
    let report = check("generate_toy_greedy_json", &toy_greedy(5).arg("--json")).json();
    // The whole prefixes on request: the ids the lengths stand for.
    let traced = toy_greedy(5)
        .args(["--trace-prefixes", "--no-timing"])
        .json();
    assert_eq!(ids(&report["prompt_ids"]), vec![0, 1, 2]);
    let generated = ids(&report["ids"]);
    assert_eq!(generated.len(), 5);
    assert_eq!(report["stop_reason"], "max_new_tokens");
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 5);
    let mut sum = 0.0;
    for (index, step) in steps.iter().enumerate() {
        let mut expected_prefix = vec![0, 1, 2];
        expected_prefix.extend_from_slice(&generated[..index]);
        assert_eq!(prefix_of(&report, step), expected_prefix, "step {index}");
        assert!(step.get("prefix").is_none(), "the prompt is given once");
        let traced_step = &traced["steps"][index];
        assert_eq!(ids(&traced_step["prefix"]), expected_prefix, "step {index}");
        assert_eq!(traced_step["prefix_len"], step["prefix_len"]);
        assert_eq!(step["token"].as_u64().unwrap() as u32, generated[index]);
        assert_eq!(step["prob"].as_f64().unwrap(), 1.0, "greedy policy");
        let logprob = step["logprob"].as_f64().unwrap();
        let reference = next_logprobs(&expected_prefix);
        assert_eq!(
            generated[index],
            argmax(&reference),
            "greedy takes the argmax"
        );
        assert!((logprob - reference[generated[index] as usize]).abs() < 1e-4);
        assert!((step["model_prob"].as_f64().unwrap() - logprob.exp()).abs() < 1e-6);
        assert_eq!(step["token_text"], Toy::word(generated[index]).unwrap());
        sum += logprob;
        assert!((step["running_logprob"].as_f64().unwrap() - sum).abs() < 1e-9);
    }
    assert!((report["sequence_logprob"].as_f64().unwrap() - sum).abs() < 1e-9);
    let words: Vec<&str> = generated.iter().map(|&id| Toy::word(id).unwrap()).collect();
    // What the prompt's text grew by: each word after a joining space.
    assert_eq!(report["text"], format!(" {}", words.join(" ")));
    let timing = &report["timing"];
    assert_eq!(timing["prefill_tokens"], 3);
    assert_eq!(timing["decode_tokens"], 4, "the final token is never fed");
    assert!(timing["prefill_ms"].as_f64().unwrap() >= 0.0);
    assert!(timing["decode_ms"].as_f64().unwrap() >= 0.0);
}

#[test]
fn temperature_zero_is_greedy() {
    let greedy = toy_greedy(6).arg("--no-timing").json();
    let zero = Cli::toy("generate")
        .n(6)
        .opt("--temperature", 0)
        .seed(9)
        .arg("--no-timing")
        .json();
    assert_eq!(greedy["ids"], zero["ids"]);
}

#[test]
fn sampled_steps_report_policy_and_model_probabilities() {
    let sampled = |n: usize, top: usize| {
        Cli::toy("generate")
            .n(n)
            .opt("--temperature", 0.5)
            .seed(3)
            .opt("--top-logprobs", top)
    };
    let report = sampled(4, 7).json();
    for step in report["steps"].as_array().unwrap() {
        let prefix = prefix_of(&report, step);
        let token = step["token"].as_u64().unwrap() as usize;
        // The policy at T = 0.5: softmax of the logits halved, from the reference.
        let reference = next_logprobs(&prefix);
        let scaled: Vec<f64> = reference.iter().map(|lp| (lp * 2.0).exp()).collect();
        let total: f64 = scaled.iter().sum();
        assert!((step["prob"].as_f64().unwrap() - scaled[token] / total).abs() < 1e-4);
        assert!((step["model_prob"].as_f64().unwrap() - reference[token].exp()).abs() < 1e-4);
        let top = step["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 7);
        let probs: f64 = top.iter().map(|c| c["prob"].as_f64().unwrap()).sum();
        assert!((probs - 1.0).abs() < 1e-4, "all seven tokens: {probs}");
    }
    // The shapes of `top_logprobs` and `policy_top` in both outputs.
    let shorter = sampled(2, 3);
    check(
        "generate_toy_top_logprobs_json",
        &shorter.clone().arg("--json"),
    );
    check("generate_toy_top_logprobs_trace", &shorter.arg("--trace"));
}

/// A seeded toy run through every filter, with every candidate printed.
fn toy_filtered() -> Cli {
    Cli::toy("generate")
        .n(6)
        .opt("--temperature", 0.8)
        .opt("--top-k", 5)
        .opt("--top-p", 0.7)
        .opt("--min-p", 0.6)
        .opt("--top-logprobs", 7)
        .seed(4)
}

/// The candidates top-k 5, top-p 0.7 and min-p 0.6 leave at T = 0.8, by
/// brute force over the reference's log-probabilities.
fn filtered_counts_by_brute_force(logprobs: &[f64]) -> [usize; 3] {
    let mut order: Vec<usize> = (0..logprobs.len()).collect();
    order.sort_by(|&a, &b| logprobs[b].total_cmp(&logprobs[a]).then(a.cmp(&b)));
    order.truncate(5);
    let weights: Vec<f64> = order.iter().map(|&i| (logprobs[i] / 0.8).exp()).collect();
    let total: f64 = weights.iter().sum();
    let reaches = |n: &usize| (weights[..*n].iter().sum::<f64>() / total) as f32 >= 0.7;
    let n_top_p = (1..=5).find(reaches).unwrap_or(5);
    let best = logprobs[order[0]];
    let n_min_p = order[..n_top_p]
        .iter()
        .filter(|&&i| ((logprobs[i] - best) / 0.8).exp() >= 0.6)
        .count();
    [5, n_top_p, n_min_p]
}

#[test]
fn a_sampled_json_step_replays_from_its_u_and_policy_candidates() {
    // Lesson 000 by hand: the policy's candidates in id order, the first whose
    // running total exceeds u is the token; each stage's count by brute force.
    let report = toy_filtered().arg("--no-timing").json();
    let mut narrowed = false;
    for step in report["steps"].as_array().unwrap() {
        let u = step["u"].as_f64().expect("a sampled step prints u");
        let mut probs = vec![0.0f32; 7];
        for candidate in step["policy_top"].as_array().unwrap() {
            probs[candidate["token"].as_u64().unwrap() as usize] =
                candidate["prob"].as_f64().unwrap() as f32;
        }
        let token = step["token"].as_u64().unwrap() as TokenId;
        assert_eq!(lm_core::sample_inverse_cdf(&probs, u).unwrap(), token);
        let [top_k, top_p, min_p] =
            filtered_counts_by_brute_force(&next_logprobs(&prefix_of(&report, step)));
        assert_eq!(
            step["n_candidates"],
            serde_json::json!({"vocabulary": 7, "penalties": 7, "temperature": 7,
                "top_k": top_k, "top_p": top_p, "min_p": min_p}),
        );
        assert_eq!(step["policy_top"].as_array().unwrap().len(), min_p);
        narrowed |= min_p < top_p && top_p < top_k;
    }
    assert!(narrowed, "some step is narrowed by both top-p and min-p");
    let greedy = toy_greedy(2).json();
    for step in greedy["steps"].as_array().unwrap() {
        assert!(step["u"].is_null(), "greedy draws nothing: {step}");
        assert_eq!(
            step["n_candidates"],
            serde_json::json!({"vocabulary": 7, "penalties": 7, "temperature": 1})
        );
    }
}

/// Every filter on at once: each reports its count under its own name, in
/// the chain's order, in `--json` and in the trace's legend.
#[test]
fn every_filter_reports_its_count_under_its_own_name() {
    let all = || {
        Cli::toy("generate")
            .n(4)
            .opt("--top-nsigma", 3)
            .opt("--top-k", 6)
            .opt("--typical", 0.99)
            .opt("--top-p", 0.99)
            .opt("--min-p", 0.01)
            .opt("--xtc-probability", 0.5)
            .opt("--xtc-threshold", 0.2)
            .opt("--top-logprobs", 7)
            .seed(4)
    };
    let names = [
        "vocabulary",
        "penalties",
        "temperature",
        "top_n_sigma",
        "top_k",
        "typical_p",
        "top_p",
        "min_p",
        "xtc",
    ];
    let report = all().arg("--no-timing").json();
    for step in report["steps"].as_array().unwrap() {
        let counts = stage_counts(step, &names);
        let n: Vec<u64> = names.map(|name| counts[name].as_u64().unwrap()).to_vec();
        assert_eq!(n[..3], [7, 7, 7], "{step}");
        assert_eq!(n[4], n[3].min(6), "top-k 6: {step}");
        assert!(n.windows(2).all(|w| w[1] <= w[0]), "{step}");
        assert_eq!(
            n[8] as usize,
            step["policy_top"].as_array().unwrap().len(),
            "{step}"
        );
    }
    let trace = all().arg("--trace").ok();
    let legend = format!(
        "candidates: {} (tokens left after each stage)",
        names.join(">")
    );
    assert_contains(&trace.stdout, &legend);
}

#[test]
fn a_sampled_trace_row_replays_from_its_printed_u_and_candidates() {
    // The same replay from the table's four-decimal numbers.
    let json = toy_filtered().arg("--no-timing").json();
    let run = toy_filtered().arg("--trace").ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    let rows: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim_start().starts_with(char::is_numeric))
        .collect();
    assert_eq!(rows.len(), 6);
    for (index, &row) in rows.iter().enumerate() {
        let cells: Vec<&str> = lines[row].split_whitespace().collect();
        let u: f64 = cells[cells.len() - 2].parse().unwrap();
        let counts = cells[cells.len() - 1];
        let policy = lines[row + 2]
            .trim_start()
            .strip_prefix("policy top: ")
            .unwrap();
        let mut probs = vec![0.0f32; 7];
        for candidate in policy.split(", ") {
            let [_, id, prob] = candidate.split(' ').collect::<Vec<_>>()[..] else {
                panic!("{candidate:?}")
            };
            probs[id.strip_prefix('#').unwrap().parse::<usize>().unwrap()] = prob.parse().unwrap();
        }
        let step = &json["steps"][index];
        let token = step["token"].as_u64().unwrap() as TokenId;
        assert_eq!(
            lm_core::sample_inverse_cdf(&probs, u).unwrap(),
            token,
            "{}",
            lines[row]
        );
        let n = &step["n_candidates"];
        let expected = [
            "vocabulary",
            "penalties",
            "temperature",
            "top_k",
            "top_p",
            "min_p",
        ]
        .map(|stage| n[stage].to_string())
        .join(">");
        assert_eq!(counts, expected);
    }
    assert_contains(
        &run.stdout,
        "candidates: vocabulary>penalties>temperature>top_k>top_p>min_p",
    );
    let greedy = toy_greedy(1).arg("--trace").ok();
    let row = greedy.stdout.lines().nth(1).unwrap();
    assert!(row.ends_with("       -  7>7>1"), "greedy has no u: {row:?}");
}

#[test]
fn trace_prints_the_table_and_the_stop_reason() {
    let run = check("generate_toy_greedy_trace", &toy_greedy(5).arg("--trace"));
    let lines: Vec<&str> = run.stdout.lines().collect();
    for column in
        "step|prefix read|selected token|policy p|model p|running ln p|u|candidates".split('|')
    {
        assert!(
            lines[0].contains(column),
            "header {:?} lacks {column}",
            lines[0]
        );
    }
    assert!(
        lines[1].trim_start().starts_with("1  <start> the cat "),
        "{}",
        lines[1]
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .count(),
        5
    );
    assert_contains(&run.stdout, "stop: max_new_tokens after 5 new tokens");
}

#[test]
fn the_context_bound_stops_a_three_token_prompt_after_two_tokens() {
    let bounded = Cli::toy("generate").opt("--context-length", 5).seed(0);
    let report = bounded.json();
    assert_eq!(ids(&report["ids"]).len(), 2);
    assert_eq!(report["stop_reason"], "context_bound");
    let trace = check("generate_toy_context_bound_trace", &bounded.arg("--trace"));
    assert!(
        trace
            .stdout
            .contains("stop: context_bound after 2 new tokens"),
        "{}",
        trace.stdout
    );
}

#[test]
fn max_new_tokens_beyond_the_context_is_clipped_with_a_note() {
    let run = Cli::toy("generate")
        .opt("--context-length", 6)
        .opt("--max-new-tokens", 50)
        .seed(0)
        .arg("--json")
        .run();
    assert_eq!(run.code, Some(0));
    assert_contains(&run.stderr, "--max-new-tokens 50 clipped to 3");
    assert_eq!(ids(&run.json()["ids"]).len(), 3);
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_or_truncated() {
    let long = Cli::new("generate")
        .model("toy")
        .opt("--prompt", "<start> the cat sat the dog slept")
        .opt("--context-length", 4);
    let refused = long.run();
    assert_eq!(refused.code, Some(1));
    assert_contains(&refused.stderr, "prompt of 7 tokens");
    let run = long.opt("--truncate", "keep-head:1").arg("--json").ok();
    assert_contains(&run.stderr, "dropped 4");
    let report = run.json();
    // Head <start>, then the two most recent tokens, then one new token.
    assert_eq!(ids(&report["prompt_ids"]), vec![0, 3, 5]);
    assert_eq!(report["n_prompt_dropped"], 4);
    assert_eq!(ids(&report["ids"]).len(), 1);
}

#[test]
fn end_tokens_and_stop_strings_end_the_run() {
    // Seed 4 draws <end> at the first step on some seeds; search for the
    // run that ends on it instead of hard-coding the seed.
    let ended = (0..50).find_map(|seed| {
        let report = Cli::toy("generate").n(5).seed(seed).json();
        (report["stop_reason"] == "end_token").then_some(report)
    });
    let report = ended.expect("some seed draws <end> within five tokens");
    let generated = ids(&report["ids"]);
    assert_eq!(generated.last(), Some(&6));
    assert_eq!(report["stop_token"], 6);
    assert!(!report["text"].as_str().unwrap().contains("<end>"));

    let greedy = toy_greedy(8).json();
    let first = greedy["steps"][0]["token_text"]
        .as_str()
        .unwrap()
        .to_owned();
    let stopped = toy_greedy(8).opt("--stop", &first).json();
    assert_eq!(stopped["stop_reason"], "stop_string");
    assert_eq!(stopped["stop_string"], first.as_str());
    assert_eq!(ids(&stopped["ids"]).len(), 1);
    // The joining space came before the stop string.
    assert_eq!(stopped["text"], " ");
    let custom_end = toy_greedy(8).opt("--end-token", &first).json();
    assert_eq!(custom_end["stop_reason"], "end_token");
}

#[test]
fn return_sequences_use_streams_of_one_seed() {
    let single = Cli::toy("generate").n(4).seed(11).arg("--no-timing");
    let many = check(
        "generate_toy_sequences_json",
        &single
            .clone()
            .opt("--num-return-sequences", 3)
            .arg("--json"),
    )
    .json();
    let sequences = many["sequences"].as_array().unwrap();
    assert_eq!(sequences.len(), 3);
    let single = single.json();
    assert_eq!(
        sequences[0]["ids"], single["ids"],
        "sequence 1 is the single run"
    );
    assert_eq!(many["ids"], single["ids"]);
}

#[test]
fn beams_with_every_token_kept_find_the_best_continuation() {
    // Seven beams over two steps keep all 49 continuations: the best beam
    // is enumeration's first.
    let beams = Cli::toy("generate")
        .n(2)
        .opt("--num-beams", 7)
        .opt("--length-penalty", 0)
        .arg("--no-end-token")
        .json();
    let all = Cli::toy("enumerate").opt("--steps", 2).json();
    assert_eq!(beams["ids"], all["continuations"][0]["ids"]);
    let list = beams["beams"].as_array().unwrap();
    assert_eq!(list.len(), 7);
    let scores: Vec<f64> = list.iter().map(|b| b["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let best_logprob = list[0]["logprob"].as_f64().unwrap();
    assert!((best_logprob - all["continuations"][0]["logprob"].as_f64().unwrap()).abs() < 1e-5);
    let step_sum: f64 = beams["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["logprob"].as_f64().unwrap())
        .sum();
    assert!((beams["sequence_logprob"].as_f64().unwrap() - step_sum).abs() < 1e-9);
}

#[test]
fn beam_search_outputs_are_pinned() {
    let beams = Cli::toy("generate").n(2).opt("--num-beams", 3);
    check("generate_toy_beams_json", &beams.clone().arg("--json"));
    check("generate_toy_beams_trace", &beams.arg("--trace"));
}

#[test]
fn no_cache_gives_the_same_run() {
    let cached = Cli::toy("generate").n(6).seed(5).arg("--no-timing");
    let uncached = cached.clone().arg("--no-cache");
    let (a, b) = (cached.json(), uncached.json());
    assert_eq!(a["ids"], b["ids"]);
    let (la, lb) = (step_logprobs(&a), step_logprobs(&b));
    assert_eq!(la.len(), 6);
    for (x, y) in la.iter().zip(&lb) {
        assert!((x - y).abs() < 1e-4, "{x} vs {y}");
    }
}

fn step_logprobs(report: &serde_json::Value) -> Vec<f64> {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["logprob"].as_f64().unwrap())
        .collect()
}

#[test]
fn same_seed_same_bytes_across_runs_and_thread_counts() {
    let run = |threads: usize| {
        Cli::generate("And God said")
            .n(15)
            .seed(42)
            .args(["--json", "--no-timing"])
            .opt("--threads", threads)
            .run()
            .stdout
    };
    let one = run(1);
    assert_contains(&one, "\"stop_reason\"");
    assert_eq!(one, run(1));
    assert_eq!(one, run(2));
}

#[test]
fn the_default_model_writes_text() {
    let run = check(
        "generate_default_text",
        &Cli::generate("And God said").seed(0).arg("--no-stream"),
    );
    assert!(run.stdout.starts_with("And God said"), "{}", run.stdout);
    let words = run.stdout.split_whitespace().count();
    assert!(words > 5, "{}", run.stdout);
    let report = check(
        "generate_default_json",
        &Cli::generate("And God said").n(10).seed(0).arg("--json"),
    )
    .json();
    let generated = ids(&report["ids"]);
    assert!(!generated.is_empty() && generated.len() <= 10);
    assert!(
        ["end_token", "max_new_tokens"].contains(&report["stop_reason"].as_str().unwrap()),
        "{}",
        report["stop_reason"]
    );
}

#[test]
fn streamed_and_buffered_text_are_the_same() {
    let run = Cli::generate("In the beginning").n(25).seed(8);
    let a = run.clone().arg("--stream").run();
    let b = run.arg("--no-stream").run();
    assert_eq!(a.code, Some(0));
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn a_count_model_generates_from_its_arpa_file() {
    let arpa = Cli::new("generate")
        .model(crate::common::count_fixture("ngram/tiny-kn3.arpa"))
        .opt("--prompt", "the cat")
        .n(4)
        .seed(1);
    check(
        "generate_count_json",
        &arpa.clone().args(["--json", "--no-timing"]),
    );
    check("generate_count_trace", &arpa.arg("--trace"));
}

#[test]
fn json_lines_stream_each_step_then_a_summary_without_steps() {
    let sampled = || {
        Cli::toy("generate")
            .n(4)
            .seed(3)
            .opt("--num-return-sequences", 2)
            .arg("--no-timing")
    };
    let lines_run = check(
        "generate_toy_json_lines",
        &sampled().arg("--json-lines").arg("--no-end-token"),
    );
    let lines: Vec<serde_json::Value> = lines_run
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    let report = sampled().arg("--no-end-token").json();
    // One line per step of each sequence, in order, then the summary.
    let mut expected = Vec::new();
    for (index, sequence) in report["sequences"].as_array().unwrap().iter().enumerate() {
        for step in sequence["steps"].as_array().unwrap() {
            let mut line = step.clone();
            line["event"] = "step".into();
            line["sequence"] = index.into();
            expected.push(line);
        }
    }
    let mut summary = report.clone();
    summary["event"] = "summary".into();
    summary.as_object_mut().unwrap().remove("steps");
    for sequence in summary["sequences"].as_array_mut().unwrap() {
        sequence.as_object_mut().unwrap().remove("steps");
    }
    expected.push(summary);
    assert_eq!(lines, expected);
    // --json --stream means --json-lines.
    let streamed = sampled()
        .arg("--no-end-token")
        .args(["--json", "--stream"])
        .ok();
    assert_eq!(streamed.stdout, lines_run.stdout);
}

#[test]
fn json_gives_the_prompt_once_so_it_grows_linearly() {
    // 400 steps of the embedded model: before, each step repeated its whole
    // prefix (the report grew with the square of the run).
    let run = |n: usize, extra: &[&str]| {
        Cli::generate("And")
            .n(n)
            .seed(1)
            .args(["--no-end-token", "--json", "--no-timing"])
            .args(extra)
            .ok()
            .stdout
    };
    let short = run(200, &[]);
    let long = run(400, &[]);
    assert!(!long.contains("\"prefix\""), "no step gives its prefix");
    assert!(
        long.len() < 2 * short.len() + 1000,
        "{} vs {}",
        long.len(),
        short.len()
    );
    // --trace-prefixes keeps them: every step its whole prefix, at least a
    // line per id on top of the report without them.
    let traced = run(400, &["--trace-prefixes"]);
    let report: serde_json::Value = serde_json::from_str(&traced).unwrap();
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 400);
    let mut n_prefix_ids = 0;
    for step in steps {
        let prefix_len = step["prefix_len"].as_u64().unwrap() as usize;
        assert_eq!(ids(&step["prefix"]).len(), prefix_len, "{step}");
        n_prefix_ids += prefix_len;
    }
    assert!(
        traced.len() > long.len() + 8 * n_prefix_ids,
        "--trace-prefixes keeps them"
    );
}

/// A count model's `<unk>` has no text: `generate` bans it (its probability
/// stays in `score`). Without the ban, this seed writes `<unk>` within 200
/// tokens of this two-line corpus, whose `<unk>` is likely.
#[test]
fn a_count_model_never_writes_unk() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, "a b\nb a\n").unwrap();
    let report = Cli::new("generate")
        .model(format!("count:{}", corpus.display()))
        .opt("--prompt", "")
        .arg("--no-end-token")
        .n(200)
        .seed(3)
        .json();
    let generated = ids(&report["ids"]);
    assert_eq!(generated.len(), 200);
    let unk = lm_model::ngram::Vocab::new().unk(); // the markers' ids are fixed
    assert!(!generated.contains(&unk), "{generated:?}");
}

/// Beam search draws nothing: a sampling flag given with `--num-beams` is a
/// usage error naming the flag, not a setting ignored while `--json` lists it.
#[test]
fn beam_search_refuses_the_sampling_flags_it_cannot_apply() {
    let beams = || Cli::toy("generate").n(2).opt("--num-beams", 3);
    // Each refused command line, and the flag the error names (an alias
    // is named by its flag's own name).
    let refused: [(&[&str], &str); 29] = [
        (&["--temperature", "0.5"], "--temperature"),
        (&["--greedy"], "--greedy"),
        (&["--top-k", "2"], "--top-k"),
        (&["--top-p", "0.5"], "--top-p"),
        (&["--min-p", "0.1"], "--min-p"),
        (&["--seed", "1"], "--seed"),
        (&["--seed", "random"], "--seed"),
        (&["--min-new-tokens", "2"], "--min-new-tokens"),
        (&["--typical", "0.9"], "--typical"),
        (&["--typical-p", "0.9"], "--typical"),
        (&["--top-nsigma", "1.5"], "--top-nsigma"),
        (&["--xtc-probability", "0.5"], "--xtc-probability"),
        (&["--xtc-probability", "0"], "--xtc-probability"),
        (&["--xtc-threshold", "0.2"], "--xtc-threshold"),
        (&["--min-keep", "2"], "--min-keep"),
        (&["--dry-multiplier", "0.8"], "--dry-multiplier"),
        (&["--dry-base", "2"], "--dry-base"),
        (&["--dry-allowed-length", "3"], "--dry-allowed-length"),
        (&["--dry-penalty-last-n", "16"], "--dry-penalty-last-n"),
        (&["--dry-sequence-breaker", "cat"], "--dry-sequence-breaker"),
        (&["--mirostat", "2"], "--mirostat"),
        (&["--mirostat-lr", "0.2"], "--mirostat-lr"),
        (&["--mirostat-eta", "0.2"], "--mirostat-lr"),
        (&["--mirostat-ent", "4"], "--mirostat-ent"),
        (&["--dynatemp-range", "0.5"], "--dynatemp-range"),
        (&["--dynatemp-exp", "1.5"], "--dynatemp-exp"),
        (&["--epsilon-cutoff", "0.01"], "--epsilon-cutoff"),
        (&["--eta-cutoff", "0.01"], "--eta-cutoff"),
        (&["--samplers", "top_k;temperature"], "--samplers"),
    ];
    let cases: Vec<Cli> = refused
        .iter()
        .map(|(args, _)| args.iter().fold(beams(), |cli, arg| cli.arg(arg)))
        .collect();
    let flags = refused.map(|(_, flag)| flag);
    for (cli, flag) in cases.iter().zip(flags) {
        let run = cli.run();
        let args = cli.line();
        assert_eq!(run.code, Some(2), "lm-cli {args}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "lm-cli {args}: {}", run.stdout);
        let first = run.stderr.lines().next().unwrap_or_default();
        assert_eq!(
            first,
            format!(
                "error: {flag} does not work with --num-beams (beam search draws nothing: it ranks hypotheses by their log-probability, after the penalties and logit bias)"
            ),
            "lm-cli {args}"
        );
    }
    // Off values that set no stage (llama.cpp's defaults) are no conflict,
    // and --json lists neither.
    let off = beams()
        .opt("--top-k", 0)
        .opt("--top-nsigma", -1)
        .opt("--mirostat", 0)
        .opt("--dry-multiplier", 0)
        .opt("--dynatemp-range", 0)
        .opt("--epsilon-cutoff", 0)
        .opt("--eta-cutoff", 0)
        .json();
    assert_eq!(off["settings"]["top_k"], serde_json::Value::Null);
    for key in [
        "top_n_sigma",
        "mirostat",
        "dry_multiplier",
        "dynatemp_range",
        "epsilon_cutoff",
        "eta_cutoff",
    ] {
        assert_eq!(off["settings"].get(key), None, "{key}");
    }
    // One beam is no beam search: the sampling flags apply.
    let one_beam = Cli::toy("generate")
        .n(2)
        .opt("--num-beams", 1)
        .opt("--temperature", 0.5)
        .seed(3)
        .json();
    assert_eq!(one_beam["settings"]["temperature"], 0.5);
    assert_eq!(one_beam["settings"]["seed"], 3);
    // Beam search reports no seed: it draws nothing.
    let report = beams().json();
    assert_eq!(report["settings"]["seed"], serde_json::Value::Null);
}

#[test]
fn beam_search_applies_the_penalties_the_logit_bias_and_top_logprobs() {
    let beams = || {
        Cli::toy("generate")
            .n(4)
            .opt("--num-beams", 3)
            .args(["--no-end-token", "--no-timing"])
    };
    let plain = beams().json();
    let best = ids(&plain["ids"]);
    let favourite = best[0];
    // A ban: no hypothesis holds the token.
    let banned = beams()
        .opt("--logit-bias", format!("{favourite}=-inf"))
        .json();
    for beam in banned["beams"].as_array().unwrap() {
        assert!(!ids(&beam["ids"]).contains(&favourite), "{beam}");
    }
    assert_eq!(ids(&banned["settings"]["banned_tokens"]), vec![favourite]);
    // A large presence penalty: the best hypothesis repeats nothing.
    assert!(best.windows(2).any(|w| w[0] == w[1]), "{best:?}");
    let penalised = beams().opt("--presence-penalty", 100).json();
    let chosen = ids(&penalised["ids"]);
    let prompt = ids(&penalised["prompt_ids"]);
    for (i, id) in chosen.iter().enumerate() {
        assert!(
            ![&prompt[..], &chosen[..i]].concat().contains(id),
            "{chosen:?}"
        );
    }
    // The model's probabilities stay the model's: each step's logprob is
    // ln model_prob; the penalised policy is what ranks.
    for step in penalised["steps"].as_array().unwrap() {
        let (lp, p) = (
            step["logprob"].as_f64().unwrap(),
            step["model_prob"].as_f64().unwrap(),
        );
        assert!((lp.exp() - p).abs() < 1e-5, "{step}");
    }
    // Top logprobs: the first step's are those greedy sampling reports for
    // the same prompt.
    let top = beams().opt("--top-logprobs", 2).json();
    let greedy = Cli::toy("generate")
        .n(1)
        .args(["--greedy", "--top-logprobs", "2"])
        .json();
    let steps = top["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    let pairs = |top: &serde_json::Value| -> Vec<(u64, f64)> {
        top.as_array()
            .unwrap()
            .iter()
            .map(|c| (c["token"].as_u64().unwrap(), c["logprob"].as_f64().unwrap()))
            .collect()
    };
    let (got, want) = (
        pairs(&steps[0]["top_logprobs"]),
        pairs(&greedy["steps"][0]["top_logprobs"]),
    );
    assert_eq!(got.len(), 2);
    for ((token, lp), (want_token, want_lp)) in got.iter().zip(&want) {
        assert_eq!(token, want_token);
        assert!((lp - want_lp).abs() < 1e-5, "{got:?} vs {want:?}");
    }
    for step in steps {
        assert_eq!(step["top_logprobs"].as_array().unwrap().len(), 2);
    }
}

/// Without `--seed` a run draws a fresh seed and names it (a `note:` on
/// stderr, `--json` settings, the `--trace` header), and `--seed N` replays
/// it; `-1` and `random` ask for a fresh seed explicitly.
#[test]
fn an_unseeded_run_draws_a_fresh_seed_and_names_it_for_replay() {
    let sample = || Cli::generate("And God said").n(12).arg("--no-stream");
    let seed_of = |stderr: &str| -> u64 {
        let line = stderr
            .lines()
            .find_map(|line| line.strip_prefix("note: seed "))
            .unwrap_or_else(|| panic!("no seed note in {stderr:?}"));
        let (seed, replay) = line.split_once(' ').unwrap();
        assert_eq!(replay, format!("(replay with --seed {seed})"));
        seed.parse().unwrap()
    };
    let first = sample().ok();
    let second = sample().ok();
    let (seed, other) = (seed_of(&first.stderr), seed_of(&second.stderr));
    assert_ne!(seed, other, "two runs drew the same seed");
    let replay = sample().seed(seed).ok();
    assert_eq!(replay.stdout, first.stdout);
    assert!(replay.stderr.is_empty(), "{}", replay.stderr);
    // The JSON settings carry the seed drawn, and it replays the run.
    let json = sample().arg("--json").arg("--no-timing").run();
    let drawn = seed_of(&json.stderr);
    assert_eq!(json.json()["settings"]["seed"], drawn);
    let replayed = sample().seed(drawn).arg("--json").arg("--no-timing").ok();
    assert_eq!(replayed.stdout, json.stdout);
    // The trace names it in its first line.
    let trace = sample().arg("--trace").ok();
    let drawn = seed_of(&trace.stderr);
    assert!(
        trace
            .stdout
            .starts_with(&format!("seed: {drawn} (replay with --seed {drawn})\n")),
        "{}",
        trace.stdout
    );
    for fresh in ["-1", "random"] {
        let run = sample().opt("--seed", fresh).ok();
        seed_of(&run.stderr);
    }
    // A greedy run draws nothing: no note, no seed.
    let greedy = sample().arg("--greedy").arg("--json").ok();
    assert!(greedy.stderr.is_empty(), "{}", greedy.stderr);
    assert_eq!(greedy.json()["settings"]["seed"], serde_json::Value::Null);
    let bad = sample().opt("--seed", "-2").run();
    bad.assert_usage_error("'-2' is not a seed (a number from 0 to 2^64 - 1, -1 or random)");
}

/// A prompt that repeats itself, so prompt lookup has something to draft.
const DRAFT_PROMPT: &str = "<start> the cat sat <end> <start> the";

/// The plain greedy toy run of [`DRAFT_PROMPT`] that the drafted runs add to.
fn greedy_to_draft() -> Cli {
    Cli::new("generate")
        .model("toy")
        .opt("--prompt", DRAFT_PROMPT)
        .n(9)
        .args(["--greedy", "--no-end-token"])
}

/// `--draft prompt-lookup`: the same ids as the plain greedy run, the
/// speculation counts in the timing, the draft marks in the steps; refused
/// with beam search; a sampled run replays with its seed.
#[test]
fn draft_prompt_lookup_gives_the_plain_greedy_ids_and_counts_its_passes() {
    let prompt = DRAFT_PROMPT;
    let plain = greedy_to_draft().json();
    let drafted = greedy_to_draft()
        .args(["--draft", "prompt-lookup"])
        .opt("--draft-tokens", 4)
        .json();
    assert_eq!(ids(&drafted["ids"]), ids(&plain["ids"]));
    assert!(plain["timing"].get("target_passes").is_none());
    let timing = &drafted["timing"];
    let drafted_tokens = timing["drafted_tokens"].as_u64().unwrap();
    let accepted = timing["accepted_tokens"].as_u64().unwrap();
    let passes = timing["target_passes"].as_u64().unwrap();
    assert!(accepted > 0 && accepted <= drafted_tokens, "{timing}");
    assert!(
        passes < 7,
        "8 tokens in fewer passes than the plain 7: {timing}"
    );
    let steps = drafted["steps"].as_array().unwrap();
    let n_marked_accepted = steps.iter().filter(|s| s["draft"] == "accepted").count();
    assert_eq!(n_marked_accepted as u64, accepted);

    let sampled = || {
        Cli::new("generate")
            .model("toy")
            .opt("--prompt", prompt)
            .n(8)
            .seed(5)
            .args(["--draft", "prompt-lookup", "--no-timing"])
    };
    assert_eq!(sampled().json(), sampled().json());

    let run = Cli::toy("generate")
        .n(2)
        .opt("--num-beams", 2)
        .args(["--draft", "prompt-lookup"])
        .run();
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .starts_with("error: --draft does not work with --num-beams"),
        "{}",
        run.stderr
    );
    let run = Cli::toy("generate").n(2).args(["--draft", "gguf"]).run();
    run.assert_usage_error(
        "'gguf' is not a drafter (expected prompt-lookup, FILE.gguf, a known model or count:FILE)",
    );
}

/// `--draft toy` (a decoder over the same vocabulary) and `--draft
/// count:FILE` (a count model, mapped through the text) on the toy decoder:
/// the plain greedy ids, drafts accepted, the drafter in the `--json`
/// settings; a decoder drafter over another vocabulary is refused before
/// anything is generated.
#[test]
fn draft_models_give_the_plain_greedy_ids() {
    let plain = greedy_to_draft().json();
    assert!(plain["settings"].get("draft").is_none());
    // The toy decoder's greedy continuation is "slept slept ...": a corpus
    // where "slept" follows "slept" drafts it.
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(
        &corpus,
        "the cat slept slept slept slept slept\nthe dog slept slept slept slept\n",
    )
    .unwrap();
    let count_spec = format!("count:{}", corpus.display());
    for draft in ["toy", count_spec.as_str()] {
        let drafted = greedy_to_draft()
            .opt("--draft", draft)
            .opt("--draft-tokens", 4)
            .json();
        assert_eq!(ids(&drafted["ids"]), ids(&plain["ids"]), "--draft {draft}");
        assert_eq!(drafted["settings"]["draft"], draft);
        assert_eq!(drafted["settings"]["draft_tokens"], 4);
        let timing = &drafted["timing"];
        let accepted = timing["accepted_tokens"].as_u64().unwrap();
        let passes = timing["target_passes"].as_u64().unwrap();
        assert!(accepted > 0, "--draft {draft}: {timing}");
        assert!(
            passes < 8,
            "--draft {draft}: 9 tokens in fewer than 8 passes: {timing}"
        );
    }

    let run = Cli::new("generate")
        .model(&count_spec)
        .opt("--prompt", "the cat")
        .n(2)
        .args(["--draft", "toy"])
        .run();
    run.assert_exit(1, "error: --draft toy: its vocabulary differs from the model's (a toy vocabulary against a count one)");
    assert!(run.stdout.is_empty(), "{}", run.stdout);
}

/// `--no-repeat-ngram-size` works with beam search (HF applies it there):
/// it is part of the raw-logit stage beam search ranks by, so no beam
/// repeats an n-gram of the prompt and its own tokens.
#[test]
fn beam_search_never_repeats_an_ngram_with_no_repeat_ngram_size() {
    let beams = |extra: &[&str]| {
        Cli::toy("generate")
            .n(4)
            .opt("--num-beams", 3)
            .arg("--no-end-token")
            .args(extra)
            .json()
    };
    let repeats = |report: &serde_json::Value, n: usize| {
        let text = [ids(&report["prompt_ids"]), ids(&report["ids"])].concat();
        let ngrams: Vec<&[TokenId]> = text.windows(n).collect();
        (0..ngrams.len()).any(|i| ngrams[..i].contains(&ngrams[i]))
    };
    // The toy decoder's best beam repeats its favourite token.
    assert!(repeats(&beams(&[]), 2), "{}", beams(&[]));
    for n in [2, 3] {
        let report = beams(&["--no-repeat-ngram-size", &n.to_string()]);
        assert_eq!(report["settings"]["no_repeat_ngram_size"], n);
        assert!(!repeats(&report, n), "{n}: {}", report["ids"]);
        for beam in report["beams"].as_array().unwrap() {
            let text = [ids(&report["prompt_ids"]), ids(&beam["ids"])].concat();
            let ngrams: Vec<&[TokenId]> = text.windows(n).collect();
            assert!(
                (0..ngrams.len()).all(|i| !ngrams[..i].contains(&ngrams[i])),
                "{n}: {beam}"
            );
        }
    }
}

/// The stages issue 38 added report under their own names, mirostat last
/// (it chooses after the last filter), and each step of a mirostat run
/// gives its bound mu, which follows llama.cpp's update
/// `mu -= eta * (surprise - tau)`, the surprise in bits of the chosen
/// token under the policy; the trace shows it in a `mu` column.
#[test]
fn mirostat_and_the_cutoffs_report_their_counts_and_mu() {
    let run = || {
        Cli::toy("generate")
            .n(5)
            .arg("--no-end-token")
            .opt("--epsilon-cutoff", 0.01)
            .opt("--eta-cutoff", 0.01)
            .opt("--mirostat", 2)
            .opt("--mirostat-ent", 1.5)
            .opt("--mirostat-lr", 0.5)
            .seed(5)
    };
    let report = run().arg("--no-timing").json();
    let names = [
        "vocabulary",
        "penalties",
        "temperature",
        "epsilon_cutoff",
        "eta_cutoff",
        "mirostat",
    ];
    let (tau, eta) = (1.5, 0.5);
    let mut truncated = false;
    let mut mu = 2.0 * tau;
    for step in report["steps"].as_array().unwrap() {
        let counts = stage_counts(step, &names);
        truncated |= counts["mirostat"].as_u64() < counts["eta_cutoff"].as_u64();
        let got = step["mirostat_mu"].as_f64().unwrap();
        assert!((got - mu).abs() < 1e-4, "mu {got}, expected {mu}: {step}");
        let surprise = -step["prob"].as_f64().unwrap().log2();
        mu -= eta * (surprise - tau);
    }
    // A bound of 3 bits at first: tokens below 1/8 are out.
    assert!(truncated, "{report}");
    // No mirostat, no mu.
    let plain = Cli::toy("generate").n(2).seed(5).json();
    assert!(plain["steps"][0].get("mirostat_mu").is_none(), "{plain}");
    let trace = run().arg("--trace").ok().stdout;
    let legend = format!(
        "candidates: {} (tokens left after each stage)",
        names.join(">")
    );
    assert_contains(&trace, &legend);
    let mut lines = trace.lines().skip_while(|line| !line.starts_with("step"));
    let header = lines.next().unwrap();
    assert!(header.ends_with("  u       mu  candidates"), "{trace}");
    assert_contains(&trace, "\nmu: mirostat's bound");
    let first = lines.next().unwrap();
    assert!(first.contains(" 3.0000  7>"), "{trace}");
}

/// A `--json` step's candidate counts, checked to name exactly the stages
/// `names` (in any order).
fn stage_counts<'a>(
    step: &'a serde_json::Value,
    names: &[&str],
) -> &'a serde_json::Map<String, serde_json::Value> {
    let counts = step["n_candidates"].as_object().unwrap();
    let mut keys: Vec<&str> = counts.keys().map(String::as_str).collect();
    let mut expected = names.to_vec();
    keys.sort_unstable();
    expected.sort_unstable();
    assert_eq!(keys, expected, "{step}");
    counts
}
