//! The embedded default model: it loads fast, reads like the King James
//! Version, and is exactly the recipe applied to the corpus.
//!
//! To check (or, with `LM_NGRAM_UPDATE=1`, rewrite) the committed file:
//! ```text
//! sh scripts/ngram/kjv_corpus.sh > /tmp/kjv.txt
//! LM_NGRAM_KJV=/tmp/kjv.txt [LM_NGRAM_UPDATE=1] cargo test -p lm-model --test tests ngram_embedded
//! ```

use std::time::Instant;

use lm_model::ngram::{EMBEDDED_COMPACT, embedded_default, embedded_options, train};

use crate::common::fixture_path;

#[test]
fn embedded_model_loads_quickly_and_knows_the_kjv() {
    let start = Instant::now();
    let model = embedded_default().unwrap();
    let elapsed = start.elapsed();
    assert!(elapsed.as_secs_f64() < 0.5, "loading took {elapsed:?}");
    assert_eq!(model.order(), 3);
    assert!(
        EMBEDDED_COMPACT.len() < 2_000_000,
        "{} bytes",
        EMBEDDED_COMPACT.len()
    );
    assert!(model.vocab().len() > 10_000, "{}", model.vocab().len());
    // Genesis 1:1 is far more likely than its words reversed.
    let forward = model.score_line("In the beginning God created the heaven and the earth .");
    let backward = model.score_line(". earth the and heaven the created God beginning the In");
    assert!(forward.total_log10() > backward.total_log10() + 20.0);
    assert_eq!(forward.n_oov(), 0);
    assert!(forward.perplexity() < 60.0, "{}", forward.perplexity());
}

#[test]
fn embedded_model_is_the_recipe_applied_to_the_corpus() {
    let Some(corpus) = std::env::var_os("LM_NGRAM_KJV") else {
        // Without the corpus, check what the file itself says about the recipe.
        let model = embedded_default().unwrap();
        let options = embedded_options();
        assert_eq!(model.order(), options.order);
        assert!(model.n_ngrams(3) < model.n_ngrams(2) * 3);
        return;
    };
    let file = std::io::BufReader::new(std::fs::File::open(corpus).unwrap());
    let model = train(file, &embedded_options(), |_| {}).unwrap();
    let bytes = model.to_compact();
    let path = fixture_path("ngram/kjv-3gram.lmng");
    if std::env::var_os("LM_NGRAM_UPDATE").is_some() {
        std::fs::write(path, &bytes).unwrap();
    }
    assert!(
        bytes == EMBEDDED_COMPACT,
        "fixtures/ngram/kjv-3gram.lmng differs from the recipe's output; rerun with LM_NGRAM_UPDATE=1"
    );
}
