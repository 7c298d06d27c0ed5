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
    fn tail_keeps_the_end() {
        assert_eq!(tail("abcdef", 10), "abcdef");
        assert_eq!(tail("abcdef", 4), "…def");
    }
}
