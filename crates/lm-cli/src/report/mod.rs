//! What the commands print: serde shapes for `--json` ([`json`]) and the
//! per-step table for `--trace` ([`trace`]).

pub mod json;
pub mod trace;

/// `text` with line breaks, tabs and other control characters written as
/// escapes, so a token or prefix stays on one table line.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A token's text as a table cell: [`printable`], with each space shown as
/// `␣` (U+2423), so a token of spaces, or a leading space (` world`), is
/// visible; line breaks and tabs are the escapes `\n`, `\t`.
pub fn token_label(text: &str) -> String {
    printable(text).replace(' ', "␣")
}

/// `x` with `decimals` decimals when that shows it (finite, below 1e6, and
/// zero or at least half a unit of the last decimal); otherwise in
/// scientific notation (`8.0000e99`, `1.2340e-101`), or `inf` / `-inf`. A
/// perplexity of 1e99 is a hundred digits in plain notation, and a tiny
/// probability is not 0.
pub fn number(x: f64, decimals: usize) -> String {
    let smallest_shown = 0.5 * 10f64.powi(-(decimals as i32));
    let plain = x == 0.0 || (smallest_shown..1e6).contains(&x.abs());
    if plain || !x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        format!("{x:.decimals$e}")
    }
}

/// The last `max_chars` characters of `text`, with `…` in front when cut.
pub fn tail(text: &str, max_chars: usize) -> String {
    let n_chars = text.chars().count();
    if n_chars <= max_chars {
        return text.to_owned();
    }
    let skip = n_chars - max_chars.saturating_sub(1);
    let mut out = String::from("…");
    out.extend(text.chars().skip(skip));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_control_characters() {
        assert_eq!(printable("a\nb\tc"), "a\\nb\\tc");
        assert_eq!(printable("\u{1}"), "\\u{1}");
        assert_eq!(printable("é"), "é");
    }

    #[test]
    fn numbers_too_large_or_small_for_plain_decimals_are_scientific() {
        assert_eq!(number(6.257846, 4), "6.2578");
        assert_eq!(number(0.0, 6), "0.000000");
        assert_eq!(number(999_999.0, 1), "999999.0");
        assert_eq!(number(8.000033e99, 4), "8.0000e99");
        assert_eq!(number(1.234e-101, 4), "1.2340e-101");
        assert_eq!(number(-1e7, 2), "-1.00e7");
        assert_eq!(number(f64::INFINITY, 4), "inf");
        assert_eq!(number(f64::NEG_INFINITY, 4), "-inf");
    }

    #[test]
    fn tail_keeps_the_end() {
        assert_eq!(tail("abcdef", 10), "abcdef");
        assert_eq!(tail("abcdef", 4), "…def");
    }
}
