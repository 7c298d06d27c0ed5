//! The printed form of the claims: an aligned table and the summary line.
//!
//! ```text
//! lesson  section                    claim            expected  computed  ok   note
//! 000     A worked example: ...      T = 0.5 row      0.867 ..  0.867 ..  ok
//! ...
//! 74 claims, 74 ok, 0 failed
//! ```

use std::fmt;

use super::{Claim, Verdict};

/// The header row.
const HEADER: [&str; 7] = [
    "lesson", "section", "claim", "expected", "computed", "ok", "note",
];

/// The claims as an aligned table, one line per claim (the last column, the
/// note, is not padded).
pub(crate) fn render(claims: &[Claim]) -> String {
    let rows: Vec<[String; 7]> = claims.iter().map(row).collect();
    let mut widths = HEADER.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = HEADER.map(String::from);
    for cells in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (index, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if index + 1 == cells.len() {
                line.push_str(cell);
            } else {
                let pad = width - cell.chars().count();
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn row(claim: &Claim) -> [String; 7] {
    let (ok, note) = match &claim.verdict {
        Verdict::Ok => ("ok", String::new()),
        Verdict::Note(note) => ("ok", note.clone()),
        Verdict::Failed(reason) => ("FAILED", reason.clone()),
    };
    [
        claim.lesson.to_string(),
        claim.section.to_string(),
        claim.claim.clone(),
        claim.expected.clone(),
        claim.computed.clone(),
        ok.to_string(),
        note,
    ]
}

/// The counts printed under the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Claims checked.
    pub n_claims: usize,
    /// Claims that hold (with or without a note).
    pub n_ok: usize,
    /// Claims that failed.
    pub n_failed: usize,
}

impl Summary {
    /// Counts `claims`.
    pub fn of(claims: &[Claim]) -> Self {
        let n_ok = claims.iter().filter(|c| c.verdict.is_ok()).count();
        Self {
            n_claims: claims.len(),
            n_ok,
            n_failed: claims.len() - n_ok,
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} claims, {} ok, {} failed",
            self.n_claims, self.n_ok, self.n_failed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_the_summary_counts() {
        let claims = vec![
            Claim::new("000", "sec", "a claim")
                .quote("q")
                .exact("0.867", "0.867"),
            Claim::new("001", "a longer section", "c")
                .quote("q")
                .exact("25", "24"),
            Claim::new("002", "s", "c")
                .quote("q")
                .check("x", "y", true)
                .note("a note"),
        ];
        let table = render(&claims);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4);
        let expected_column = lines[0].find("expected").unwrap();
        assert_eq!(lines[1].find("0.867"), Some(expected_column));
        assert_eq!(lines[2].find("25"), Some(expected_column));
        assert!(lines[2].contains("FAILED"));
        let note_column = lines[0].find("note").unwrap();
        assert_eq!(lines[3].find("a note"), Some(note_column));
        assert!(
            lines[1].ends_with("ok"),
            "no trailing blanks: {:?}",
            lines[1]
        );
        let summary = Summary::of(&claims);
        assert_eq!(summary.to_string(), "3 claims, 2 ok, 1 failed");
    }
}
