//! `lm-cli score`, `enumerate`, `tokenize` and `train`: against the toy
//! decoder's reference path, brute force, and KenLM's committed query
//! output, with the outputs scripts read pinned by snapshots.

use lm_core::TokenId;

use crate::common::{Cli, assert_contains, check, count_fixture, fixture, floats, ids};
use crate::toy_reference::continuation_logprobs;

#[test]
fn score_gives_chain_rule_logprobs_and_perplexity() {
    let score = Cli::toy("score").opt("--continuation", "dog <start> slept");
    let report = check("score_toy_json", &score.clone().arg("--json")).json();
    assert_eq!(ids(&report["ids"]), vec![3, 0, 5]);
    let logprobs = floats(&report["logprobs"]);
    let reference = continuation_logprobs(&[0, 1, 2], &[3, 0, 5]);
    for (got, want) in logprobs.iter().zip(&reference) {
        assert!((got - want).abs() < 1e-4, "{logprobs:?} vs {reference:?}");
    }
    let total: f64 = logprobs.iter().sum();
    assert!((report["sequence_logprob"].as_f64().unwrap() - total).abs() < 1e-9);
    let perplexity = (-total / 3.0).exp();
    assert!((report["perplexity"].as_f64().unwrap() - perplexity).abs() < 1e-9);
    check("score_toy_text", &score);
}

#[test]
fn score_agrees_with_the_generated_steps() {
    // An <end> run has no text to score: take the first seed whose four
    // tokens hold no <end> (seed 2, once hard-coded here, draws one).
    let run = (0..50)
        .map(|seed| Cli::toy("generate").n(4).seed(seed).json())
        .find(|run| !ids(&run["ids"]).contains(&6))
        .expect("some seed draws four tokens without <end>");
    let text = run["text"].as_str().unwrap();
    let scored = Cli::toy("score").opt("--continuation", text).json();
    assert_eq!(scored["ids"], run["ids"]);
    let a = run["sequence_logprob"].as_f64().unwrap();
    let b = scored["sequence_logprob"].as_f64().unwrap();
    assert!((a - b).abs() < 1e-5, "{a} vs {b}");
}

#[test]
fn enumerate_ranks_all_2401_continuations_like_brute_force() {
    let report = Cli::toy("enumerate")
        .opt("--steps", 4)
        .opt("--top", 0)
        .json();
    assert_eq!(report["total"], 2401);
    let continuations = report["continuations"].as_array().unwrap();
    assert_eq!(continuations.len(), 2401);
    // Brute force: every continuation scored by the reference path.
    let mut all: Vec<(f64, Vec<TokenId>)> = Vec::with_capacity(2401);
    for n in 0..2401u32 {
        let c = vec![n / 343, n / 49 % 7, n / 7 % 7, n % 7];
        let lp: f64 = continuation_logprobs(&[0, 1, 2], &c).iter().sum();
        all.push((lp, c));
    }
    all.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total_prob: f64 = all.iter().map(|(lp, _)| lp.exp()).sum();
    assert!(
        (total_prob - 1.0).abs() < 1e-4,
        "probabilities sum to {total_prob}"
    );
    for (rank, (lp, c)) in all.iter().take(5).enumerate() {
        assert_eq!(ids(&continuations[rank]["ids"]), *c, "rank {}", rank + 1);
        let prob = continuations[rank]["prob"].as_f64().unwrap();
        assert!((prob - lp.exp()).abs() < 1e-6);
    }
    // Greedy by brute force: the argmax at each step.
    let mut greedy: Vec<TokenId> = Vec::new();
    for _ in 0..4 {
        let mut best = (f64::NEG_INFINITY, 0);
        for token in 0..7 {
            let mut c = greedy.clone();
            c.push(token);
            let lp = *continuation_logprobs(&[0, 1, 2], &c).last().unwrap();
            if lp > best.0 {
                best = (lp, token);
            }
        }
        greedy.push(best.1);
    }
    assert_eq!(ids(&report["greedy"]), greedy);
    let greedy_lp: f64 = continuation_logprobs(&[0, 1, 2], &greedy).iter().sum();
    let rank = 1 + all.iter().filter(|(lp, _)| *lp > greedy_lp + 1e-9).count();
    assert_eq!(report["greedy_rank"].as_u64().unwrap() as usize, rank);
    assert!(
        rank > 1,
        "lesson 001: at four tokens greedy is not the most probable"
    );
    let ranks = check(
        "enumerate_toy_json",
        &Cli::toy("enumerate").opt("--steps", 3).arg("--json"),
    )
    .json();
    assert_eq!(
        ranks["greedy_rank"], 1,
        "at three tokens greedy is the best"
    );
    assert_eq!(
        ranks["continuations"].as_array().unwrap().len(),
        10,
        "--top defaults to 10"
    );
}

#[test]
fn enumerate_text_marks_greedy() {
    let run = check(
        "enumerate_toy_text",
        &Cli::toy("enumerate").opt("--steps", 2),
    );
    assert!(
        run.stdout.starts_with("49 continuations of 2 tokens"),
        "{}",
        run.stdout
    );
    assert_contains(&run.stdout, "<- greedy");
}

#[test]
fn tokenize_shows_ids_and_tokens() {
    let toy = Cli::new("tokenize")
        .model("toy")
        .opt("--text", "<start> the cat");
    let report = check("tokenize_toy_json", &toy.clone().arg("--json")).json();
    assert_eq!(ids(&report["ids"]), vec![0, 1, 2]);
    assert_eq!(
        report["tokens"],
        serde_json::json!(["<start>", "the", "cat"])
    );
    check("tokenize_toy_text", &toy);
    let count = Cli::new("tokenize").opt("--text", "And God said, Let");
    let report = check("tokenize_default_json", &count.clone().arg("--json")).json();
    assert_eq!(
        report["tokens"],
        serde_json::json!(["And", "God", "said", ",", "Let"])
    );
    check("tokenize_default_text", &count);
}

/// KenLM's `query` scores of `tiny-query.txt` under `tiny-kn3.arpa`, as
/// committed: (sentence, per-token log10 probabilities) for bos and eos on.
fn kenlm_scores() -> Vec<(String, Vec<f64>)> {
    let tsv = std::fs::read_to_string(fixture("ngram/tiny-query-kenlm.tsv")).unwrap();
    tsv.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            (fields[0] == "1" && fields[1] == "1").then(|| {
                let scores = fields[4].split(' ').map(|s| s.parse().unwrap()).collect();
                (fields[2].to_owned(), scores)
            })
        })
        .collect()
}

fn check_against_kenlm(model: &str) {
    let sentences = kenlm_scores();
    assert!(sentences.len() >= 5);
    for (sentence, expected) in sentences {
        let report = Cli::new("score")
            .model(model)
            .opt("--text", &sentence)
            .json();
        let got = floats(&report["log10probs"]);
        assert_eq!(got.len(), expected.len(), "{sentence}");
        for (g, e) in got.iter().zip(&expected) {
            assert!(
                (g - e).abs() < 1e-4,
                "{sentence}: {got:?} vs KenLM {expected:?}"
            );
        }
        let total: f64 = expected.iter().sum();
        assert!((report["total_log10"].as_f64().unwrap() - total).abs() < 1e-3);
    }
}

#[test]
fn score_text_matches_kenlm_query() {
    let arpa = count_fixture("ngram/tiny-kn3.arpa");
    check_against_kenlm(&arpa);
    // The sentence report's fields, with an out-of-vocabulary word.
    let sentence = Cli::new("score")
        .model(&arpa)
        .opt("--text", "the cat sat on the zebra");
    check("score_count_sentence_json", &sentence.clone().arg("--json"));
    check("score_count_sentence_text", &sentence);
}

/// `lm-cli train --corpus corpus --out out` with `options` in between.
fn train(corpus: &std::path::Path, out: &std::path::Path, options: &[&str]) -> crate::common::Run {
    Cli::new("train")
        .opt("--corpus", corpus.display())
        .args(options)
        .opt("--out", out.display())
        .ok()
}

/// A temporary folder holding `corpus.txt` with `text`.
fn temp_corpus(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, text).unwrap();
    (dir, corpus)
}

#[test]
fn train_then_score_matches_kenlm_query() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny.arpa");
    let corpus = fixture("ngram/tiny.txt");
    let run = train(
        &corpus,
        &out,
        &["--order", "3", "--smoothing", "kneser-ney"],
    );
    assert_contains(&run.stderr, "wrote");
    assert!(run.stdout.is_empty(), "train prints to stderr only");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
    check_against_kenlm(&format!("count:{}", out.display()));
}

/// `--discount-fallback` on a corpus too small for Kneser-Ney trains, and
/// says which orders took the fallback discounts.
#[test]
fn train_notes_each_order_that_took_the_fallback_discounts() {
    let (dir, corpus) = temp_corpus("a b\na\n");
    let out = dir.path().join("fallback.arpa");
    let run = train(&corpus, &out, &["--order", "2", "--discount-fallback"]);
    for order in [1, 2] {
        let note = format!(
            "note: kneser-ney discounts for {order}-grams cannot be estimated from this corpus (adjusted count 3); used the fallback discounts D1 = 0.5, D2 = 1, D3+ = 1.5"
        );
        assert_contains(&run.stderr, &note);
    }
}

#[test]
fn train_with_mle_and_add_k_writes_arpa() {
    let (dir, corpus) = temp_corpus("the cat sat\nthe dog sat\n");
    let out = dir.path().join("mle.arpa");
    train(&corpus, &out, &["--order", "2", "--smoothing", "mle"]);
    // MLE: p(cat | the) = count(the cat) / count(the) = 1/2.
    let report = Cli::new("score")
        .model(format!("count:{}", out.display()))
        .opt("--prompt", "the")
        .opt("--continuation", "cat")
        .json();
    let p = floats(&report["logprobs"])[0].exp();
    assert!((p - 0.5).abs() < 1e-5, "{p}");
    let add_k = dir.path().join("addk.arpa");
    let options = ["--order", "2", "--smoothing", "add-k", "--k", "1"];
    train(&corpus, &add_k, &options);
    assert!(
        std::fs::read_to_string(&add_k)
            .unwrap()
            .starts_with("\\data\\")
    );
}

#[test]
fn a_corpus_given_as_count_model_is_trained_on_the_fly() {
    let run = Cli::new("generate")
        .model(count_fixture("ngram/tiny.txt"))
        .opt("--prompt", "the cat")
        .arg("--greedy")
        .n(3)
        .arg("--json")
        .ok();
    assert_contains(&run.stderr, "trained a trigram");
}

/// `lm-cli score ARGS` on a unigram ARPA model, written to `dir`, in which
/// `cat` has probability 0 (log10 p = -inf) and `dog` 10^-200.
fn score_on_zero_probability_model(dir: &std::path::Path, args: &[&str]) -> Cli {
    let path = dir.join("zero.arpa");
    let arpa = "\\data\\\nngram 1=5\n\n\\1-grams:\n-99\t<s>\n-0.5\tthe\n-inf\tcat\n\
                -200\tdog\n-0.5\t</s>\n\n\\end\\\n";
    std::fs::write(&path, arpa).unwrap();
    Cli::new("score")
        .model(format!("count:{}", path.display()))
        .args(args)
}

#[test]
fn a_zero_probability_scores_minus_inf_and_an_infinite_perplexity() {
    let dir = tempfile::tempdir().unwrap();
    let sentence = score_on_zero_probability_model(dir.path(), &["--text", "the cat"]);
    let text = sentence.ok().stdout;
    assert_contains(&text, "total log10 p: -inf, perplexity inf");
    // JSON has no infinities (serde_json would write null): strings instead.
    let report = sentence.json();
    assert_eq!(report["log10probs"][1], "-inf");
    assert_eq!(report["total_log10"], "-inf");
    assert_eq!(report["perplexity"], "inf");
    let continuation =
        score_on_zero_probability_model(dir.path(), &["--prompt", "the", "--continuation", "cat"]);
    let report = continuation.json();
    assert_eq!(report["logprobs"][0], "-inf");
    assert_eq!(report["sequence_logprob"], "-inf");
    assert_eq!(report["perplexity"], "inf");
    let masked = Cli::new("probs").opt("--logits", "2,-inf").json();
    assert_eq!(masked["logits"][1], "-inf");
}

#[test]
fn huge_perplexities_and_tiny_probabilities_print_in_scientific_notation() {
    let dir = tempfile::tempdir().unwrap();
    let sentence = score_on_zero_probability_model(dir.path(), &["--text", "dog"]);
    let text = sentence.ok().stdout;
    let perplexity = sentence.json()["perplexity"].as_f64().unwrap();
    let line = text.lines().last().unwrap();
    let printed = line.rsplit(' ').next().unwrap();
    assert!(printed.contains('e'), "{line}");
    let printed: f64 = printed.parse().unwrap();
    assert!(
        (printed / perplexity - 1.0).abs() < 1e-4,
        "{line} vs {perplexity}"
    );
    let continuation =
        score_on_zero_probability_model(dir.path(), &["--prompt", "the", "--continuation", "dog"])
            .ok()
            .stdout;
    // p = 10^-200 is not 0.000000, and the perplexity is not 200 digits.
    assert!(continuation.contains("e-200)"), "{continuation}");
    assert!(!continuation.contains("0.000000"), "{continuation}");
    assert!(continuation.lines().all(|l| l.len() < 80), "{continuation}");
}

/// `score --text` cuts words as `train` does: "mat." is "mat" and ".", both
/// known to a model trained on "The cat sat on the mat."; the unknown words a
/// score met are counted in a note.
#[test]
fn score_text_splits_words_as_training_does_and_notes_unknown_words() {
    let (dir, corpus) = temp_corpus("The cat sat on the mat.\n");
    let out = dir.path().join("mat.arpa");
    train(&corpus, &out, &["--order", "2", "--discount-fallback"]);
    let model = format!("count:{}", out.display());
    let score = |text: &str| Cli::new("score").model(&model).opt("--text", text).ok();
    let known = score("The cat sat on the mat.");
    let report: serde_json::Value = Cli::new("score")
        .model(&model)
        .opt("--text", "The cat sat on the mat.")
        .json();
    assert_eq!(
        report["words"],
        serde_json::json!(["The", "cat", "sat", "on", "the", "mat", ".", "</s>"])
    );
    assert_eq!(report["oov"], serde_json::json!(vec![false; 8]));
    assert!(!known.stdout.contains("unknown word"), "{}", known.stdout);
    assert!(known.stderr.is_empty(), "{}", known.stderr);
    let unknown = score("The zebra sat on the rug.");
    assert!(
        unknown
            .stderr
            .contains("note: 2 of 7 words not in the model's vocabulary, scored as <unk>"),
        "{}",
        unknown.stderr
    );
    // The same note when a count model scores a continuation.
    let continuation = Cli::new("score")
        .model(&model)
        .opt("--prompt", "The cat")
        .opt("--continuation", "sat on the rug.")
        .ok();
    assert!(
        continuation
            .stderr
            .contains("note: 1 of 7 words not in the model's vocabulary, scored as <unk>"),
        "{}",
        continuation.stderr
    );
}

#[test]
fn score_file_of_a_count_model_sums_kenlm_query_over_its_lines() {
    // KenLM's query of every line of tiny-query.txt (with <s> and </s>).
    let tsv = std::fs::read_to_string(fixture("ngram/tiny-query-kenlm.tsv")).unwrap();
    let (mut total, mut n_tokens, mut n_oov, mut in_vocab) = (0.0, 0, 0, 0.0);
    for line in tsv.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        if fields[0] != "1" || fields[1] != "1" {
            continue;
        }
        let scores: Vec<f64> = fields[4].split(' ').map(|s| s.parse().unwrap()).collect();
        let oov: Vec<bool> = fields[6].split(' ').map(|s| s == "1").collect();
        total += scores.iter().sum::<f64>();
        n_tokens += scores.len();
        n_oov += oov.iter().filter(|&&o| o).count();
        in_vocab += scores
            .iter()
            .zip(&oov)
            .filter(|(_, o)| !**o)
            .map(|(s, _)| s)
            .sum::<f64>();
    }
    let report = Cli::new("score")
        .model(count_fixture("ngram/tiny-kn3.arpa"))
        .opt("--file", fixture("ngram/tiny-query.txt").display())
        .json();
    assert_eq!(report["n_sentences"], 8);
    assert_eq!(report["n_tokens"], n_tokens);
    assert_eq!(report["n_oov"], n_oov);
    assert!(n_oov > 0, "the fixture has unknown words");
    let got = report["total_log10"].as_f64().unwrap();
    assert!((got - total).abs() < 1e-3, "{got} vs KenLM {total}");
    let perplexity = 10f64.powf(-total / n_tokens as f64);
    let got = report["perplexity"].as_f64().unwrap();
    assert!(
        (got / perplexity - 1.0).abs() < 1e-4,
        "{got} vs {perplexity}"
    );
    let excluding = 10f64.powf(-in_vocab / (n_tokens - n_oov) as f64);
    let got = report["perplexity_excluding_oov"].as_f64().unwrap();
    assert!((got / excluding - 1.0).abs() < 1e-4, "{got} vs {excluding}");
}

#[test]
fn score_file_scores_every_token_after_the_first_in_windows_of_the_context() {
    // The toy has no BOS: the first word is the context of the rest. With a
    // context of 3, the six words after it are scored in windows of two,
    // each read from the word before it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("text.txt");
    let words = ["<start>", "the", "cat", "dog", "sat", "the", "cat"];
    std::fs::write(&path, words.join(" ")).unwrap();
    let report = Cli::new("score")
        .model("toy")
        .opt("-c", 3)
        .opt("--file", path.display())
        .json();
    assert_eq!(report["n_tokens"], 6);
    assert_eq!(report["n_windows"], 3);
    assert_eq!(report["from_bos"], false);
    let mut expected = 0.0;
    for window in [1, 3, 5] {
        let pair = Cli::new("score")
            .model("toy")
            .opt("--prompt", words[window - 1])
            .opt("--continuation", words[window..window + 2].join(" "))
            .json();
        expected += pair["sequence_logprob"].as_f64().unwrap();
    }
    let got = report["logprob"].as_f64().unwrap();
    assert!((got - expected).abs() < 1e-9, "{got} vs {expected}");
    // A context long enough for the whole text: one window, the chain rule.
    let whole = Cli::new("score")
        .model("toy")
        .opt("--file", path.display())
        .json();
    let reference: f64 = continuation_logprobs(&[0], &[1, 2, 3, 4, 1, 2])
        .iter()
        .sum();
    let got = whole["logprob"].as_f64().unwrap();
    assert!((got - reference).abs() < 1e-4, "{got} vs {reference}");
    assert_eq!(whole["n_windows"], 1);
    // A missing file is named.
    let run = Cli::new("score").opt("--file", "no/such.txt").run();
    assert_eq!(run.code, Some(1));
    assert_contains(&run.stderr, "no/such.txt");
}

#[test]
#[ignore = "needs SmolLM2: cargo xtask fetch-model smollm2"]
fn a_gguf_text_is_scored_from_the_document_start() {
    if let Err(err) = lm_model::catalog::SMOLLM2.path() {
        panic!("{err}");
    }
    let text = "In the beginning God created the heaven and the earth.";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("text.txt");
    std::fs::write(&path, text).unwrap();
    let file = Cli::new("score")
        .model("smollm2")
        .opt("--file", path.display())
        .json();
    assert_eq!(file["from_bos"], true);
    // SmolLM2's BOS <|im_start|> opens a chat turn, so a document starts
    // after <|endoftext|> (id 0): the same as scoring the text after it,
    // every token counted, and as the continuation with no prompt.
    let tokens = Cli::new("tokenize")
        .model("smollm2")
        .opt("--text", text)
        .json();
    let pair = Cli::new("score")
        .model("smollm2")
        .opt("--prompt", "<|endoftext|>")
        .opt("--continuation", text)
        .json();
    assert_eq!(pair["prompt_ids"], serde_json::json!([0]));
    let alone = Cli::new("score")
        .model("smollm2")
        .opt("--continuation", text)
        .json();
    assert_eq!(alone["prompt_ids"], serde_json::json!([0]));
    assert_eq!(alone["sequence_logprob"], pair["sequence_logprob"]);
    assert_eq!(file["n_tokens"], tokens["ids"].as_array().unwrap().len());
    let (got, want) = (
        file["logprob"].as_f64().unwrap(),
        pair["sequence_logprob"].as_f64().unwrap(),
    );
    assert!((got - want).abs() < 1e-3, "{got} vs {want}");
}
