//! `cargo xtask check-lessons`: runs every worked example, table and numeric
//! claim of the three lesson texts through the project's own crates and
//! prints one row per claim (lesson, section, claim, expected, computed, ok,
//! note). Exits non-zero when any claim fails.
//!
//! ```text
//! lesson_000  softmax with temperature, inverse CDF, cost of generation, knowledge check
//! lesson_001  the toy decoder: traces, chain rule, greedy vs search, stopping, cache, mask
//! lesson_002  softmax, temperature, beam search, top-k / top-p, cross-entropy, smoothing
//!      │
//!      └─> Vec<Claim> ──> quotes checked against ../shared/lessons ──> table ──> exit code
//! ```
//!
//! The expected values are embedded here, each with a verbatim quote of the
//! lesson sentence it comes from. When `<project root>/../shared/lessons`
//! exists, every quote must appear in its lesson (whitespace-insensitive), so
//! the table cannot drift from the texts; without the folder the claims still
//! run and the quotes go unchecked.
//!
//! Lesson 001's SDK decoder is not available: its model-specific numbers are
//! replaced by the toy decoder's (pinned by the insta snapshots of
//! [`toy_runs`]) and every relationship the lesson states is checked on it.
//! A claim that holds but differs from the lesson in a way worth knowing
//! (rounding, the toy standing in for the SDK) carries a note.

mod lesson_000;
mod lesson_001;
mod lesson_002;
mod table;
mod toy_runs;

use std::fmt::Display;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::project_root;

/// One checked claim: a row of the table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Claim {
    /// The lesson number, "000", "001" or "002".
    pub lesson: &'static str,
    /// The lesson's section heading the claim comes from.
    pub section: &'static str,
    /// What is claimed, in a few words.
    pub claim: String,
    /// Verbatim fragments of the lesson text this claim rests on.
    pub quotes: Vec<&'static str>,
    /// The value the lesson states (or the relationship it states).
    pub expected: String,
    /// What the project's code computes.
    pub computed: String,
    /// Whether they agree.
    pub verdict: Verdict,
}

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Expected and computed agree.
    Ok,
    /// They agree, with something worth reading (a rounding, a toy number).
    Note(String),
    /// They disagree, and why.
    Failed(String),
}

impl Verdict {
    /// True unless failed.
    pub fn is_ok(&self) -> bool {
        !matches!(self, Self::Failed(_))
    }
}

impl Claim {
    /// A claim of `lesson`, in `section`, not yet checked.
    pub fn new(lesson: &'static str, section: &'static str, claim: impl Into<String>) -> Self {
        Self {
            lesson,
            section,
            claim: claim.into(),
            quotes: Vec::new(),
            expected: String::new(),
            computed: String::new(),
            verdict: Verdict::Failed("not checked".into()),
        }
    }

    /// Adds a verbatim fragment of the lesson text the claim rests on.
    pub fn quote(mut self, fragment: &'static str) -> Self {
        self.quotes.push(fragment);
        self
    }

    /// Ok when `computed` prints exactly as `expected`.
    pub fn exact(self, expected: impl Display, computed: impl Display) -> Self {
        let (expected, computed) = (expected.to_string(), computed.to_string());
        let holds = expected == computed;
        self.check(expected, computed, holds)
    }

    /// Ok when `holds`; `expected` and `computed` are what the table shows.
    pub fn check(mut self, expected: impl Display, computed: impl Display, holds: bool) -> Self {
        self.expected = expected.to_string();
        self.computed = computed.to_string();
        self.verdict = if holds {
            Verdict::Ok
        } else {
            Verdict::Failed("computed does not match expected".into())
        };
        self
    }

    /// Attaches a note to a claim that holds (a failed claim keeps its reason).
    pub fn note(mut self, note: impl Into<String>) -> Self {
        if self.verdict.is_ok() {
            self.verdict = Verdict::Note(note.into());
        }
        self
    }
}

/// The lesson texts by number, read from the shared folder.
#[derive(Debug, Default)]
pub(crate) struct LessonTexts {
    texts: Vec<(&'static str, String)>,
}

impl LessonTexts {
    /// Reads `NNN_*.txt` for each lesson from `dir`; `None` when the folder
    /// does not exist.
    pub fn read(dir: &Path) -> anyhow::Result<Option<Self>> {
        if !dir.is_dir() {
            return Ok(None);
        }
        let mut texts = Vec::new();
        for lesson in ["000", "001", "002"] {
            let prefix = format!("{lesson}_");
            let mut found = None;
            for entry in
                std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?
            {
                let path = entry?.path();
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                if name.starts_with(&prefix) && name.ends_with(".txt") {
                    found = Some(path);
                }
            }
            let Some(path) = found else {
                bail!("no lesson {lesson} (`{prefix}*.txt`) in {}", dir.display());
            };
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            texts.push((lesson, normalize_whitespace(&text)));
        }
        Ok(Some(Self { texts }))
    }

    /// A set of texts given directly (for tests).
    #[cfg(test)]
    pub fn from_texts(texts: Vec<(&'static str, &str)>) -> Self {
        Self {
            texts: texts
                .into_iter()
                .map(|(lesson, text)| (lesson, normalize_whitespace(text)))
                .collect(),
        }
    }

    /// Fails every claim one of whose quotes is not in its lesson's text.
    pub fn verify_quotes(&self, claims: &mut [Claim]) {
        for claim in claims {
            let text = self
                .texts
                .iter()
                .find(|(lesson, _)| *lesson == claim.lesson)
                .map(|(_, text)| text.as_str());
            let missing: Vec<&str> = match text {
                None => vec!["(no text for this lesson)"],
                Some(text) => claim
                    .quotes
                    .iter()
                    .copied()
                    .filter(|quote| !text.contains(&normalize_whitespace(quote)))
                    .collect(),
            };
            if claim.quotes.is_empty() {
                claim.verdict = Verdict::Failed("the claim quotes no lesson text".into());
            } else if !missing.is_empty() {
                claim.verdict = Verdict::Failed(format!(
                    "not in lesson {}: {}",
                    claim.lesson,
                    missing.join(" | ")
                ));
            }
        }
    }
}

/// Runs of whitespace (spaces, tabs, newlines) become one space.
fn normalize_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Values printed with `decimals` decimals, separated by spaces: the form the
/// lessons round to.
pub(crate) fn fixed(values: &[f32], decimals: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Where CI puts the shared folder: beside the repository.
fn default_lessons_dir() -> PathBuf {
    project_root().join("..").join("shared").join("lessons")
}

/// Every claim of the three lessons, computed (quotes not yet verified).
pub(crate) fn all_claims() -> anyhow::Result<Vec<Claim>> {
    let mut claims = lesson_000::claims()?;
    claims.extend(lesson_001::claims()?);
    claims.extend(lesson_002::claims()?);
    Ok(claims)
}

/// Computes every claim and checks its quotes against the texts in `dir`
/// when that folder exists. Returns the claims and whether texts were found.
pub(crate) fn checked_claims(dir: &Path) -> anyhow::Result<(Vec<Claim>, bool)> {
    let mut claims = all_claims()?;
    let texts = LessonTexts::read(dir)?;
    if let Some(texts) = &texts {
        texts.verify_quotes(&mut claims);
    }
    Ok((claims, texts.is_some()))
}

/// The usage line printed with argument errors and `--help`.
pub(crate) const USAGE: &str = "usage: cargo xtask check-lessons [--lessons <dir>]";

/// `cargo xtask check-lessons [--lessons <dir>]`.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let dir = match args {
        [] => default_lessons_dir(),
        [flag, dir] if flag == "--lessons" => PathBuf::from(dir),
        other => bail!("{USAGE}, got {other:?}"),
    };
    let (claims, found_texts) = checked_claims(&dir)?;
    print!("{}", table::render(&claims));
    println!();
    print!("{}", toy_runs::all_tables()?);
    if found_texts {
        println!(
            "every quote was found in the lesson texts at {}",
            dir.display()
        );
    } else {
        println!(
            "note: no lesson texts at {}; quotes were not checked against them",
            dir.display()
        );
    }
    let summary = table::Summary::of(&claims);
    println!("{summary}");
    if summary.n_failed > 0 {
        bail!("{} lesson claim(s) failed", summary.n_failed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lesson_claim_holds() {
        let (claims, _) = checked_claims(&default_lessons_dir()).unwrap();
        let failed: Vec<String> = claims
            .iter()
            .filter(|c| !c.verdict.is_ok())
            .map(|c| {
                format!(
                    "{} / {} / {}: {:?}",
                    c.lesson, c.section, c.claim, c.verdict
                )
            })
            .collect();
        assert!(failed.is_empty(), "failed claims:\n{}", failed.join("\n"));
        assert!(claims.len() >= 40, "only {} claims", claims.len());
        for lesson in ["000", "001", "002"] {
            assert!(
                claims.iter().any(|c| c.lesson == lesson),
                "no claim of {lesson}"
            );
        }
    }

    #[test]
    fn every_claim_quotes_its_lesson() {
        let claims = all_claims().unwrap();
        let bare: Vec<&str> = claims
            .iter()
            .filter(|c| c.quotes.is_empty())
            .map(|c| c.claim.as_str())
            .collect();
        assert!(bare.is_empty(), "claims without a quote: {bare:?}");
    }

    #[test]
    fn docs_lessons_md_lists_every_claim() {
        let path = project_root().join("docs").join("lessons.md");
        let docs = std::fs::read_to_string(&path).unwrap();
        let missing: Vec<String> = all_claims()
            .unwrap()
            .iter()
            .map(|c| {
                format!(
                    "| {} | {} | {} |",
                    c.lesson,
                    c.section,
                    c.claim.replace('|', "\\|")
                )
            })
            .filter(|row| !docs.contains(row.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "not in {}:\n{}",
            path.display(),
            missing.join("\n")
        );
    }

    #[test]
    fn a_quote_missing_from_the_text_fails_the_claim() {
        let texts = LessonTexts::from_texts(vec![("000", "sum 62.99,\n so p = (0.867,\t0.117)")]);
        let quoting = |lesson: &'static str, claim: &str, quote: &'static str| {
            Claim::new(lesson, "s", claim).quote(quote)
        };
        let mut claims = vec![
            quoting(
                "000",
                "present across a line break",
                "62.99, so p = (0.867, 0.117)",
            ),
            quoting("000", "drifted", "sum 63.00"),
            quoting("001", "no text", "anything"),
            Claim::new("000", "s", "no quote"),
        ]
        .into_iter()
        .map(|claim| claim.exact("1", "1"))
        .collect::<Vec<_>>();
        texts.verify_quotes(&mut claims);
        assert_eq!(claims[0].verdict, Verdict::Ok);
        assert_eq!(
            claims[1].verdict,
            Verdict::Failed("not in lesson 000: sum 63.00".into())
        );
        assert!(!claims[2].verdict.is_ok());
        assert!(!claims[3].verdict.is_ok());
    }

    #[test]
    fn verdicts_follow_the_comparison() {
        let ok = Claim::new("000", "s", "c")
            .quote("q")
            .exact("0.867", "0.867");
        assert_eq!(ok.verdict, Verdict::Ok);
        let bad = Claim::new("000", "s", "c")
            .quote("q")
            .exact("0.867", "0.868");
        assert!(!bad.verdict.is_ok());
        let noted = Claim::new("000", "s", "c")
            .quote("q")
            .check("a", "b", true)
            .note("n");
        assert_eq!(noted.verdict, Verdict::Note("n".into()));
        let still_bad = bad.note("n");
        assert!(!still_bad.verdict.is_ok(), "a note never rescues a failure");
    }
}
