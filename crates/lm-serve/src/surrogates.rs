//! Lone UTF-16 surrogate escapes in request JSON (`"\ud800"`), which
//! serde_json refuses, become `\uFFFD` (U+FFFD, the replacement character)
//! before parsing, as browsers' and Python's lenient decoders do: a client
//! that cuts a string between the halves of a pair (an emoji) gets an
//! answer, not a 400.

use std::borrow::Cow;

/// `json` with every lone surrogate escape (`\uD800`-`\uDBFF` not followed
/// by `\uDC00`-`\uDFFF`, or a `\uDC00`-`\uDFFF` alone) rewritten to
/// `\uFFFD`; borrowed when there is none. Each escape keeps its six bytes,
/// so offsets in later parse errors still point into the body as sent.
///
/// Escapes are recognised as JSON reads them: `\\` is a backslash, so the
/// text `\\ud800` holds no escape.
pub(crate) fn replace_lone_surrogates(json: &[u8]) -> Cow<'_, [u8]> {
    let mut fixed: Option<Vec<u8>> = None;
    let mut idx = 0;
    while idx < json.len() {
        if json[idx] != b'\\' {
            idx += 1;
            continue;
        }
        let Some(unit) = escaped_unit(json, idx) else {
            // `\"`, `\\`, `\n`, ... (or a bad escape, for serde_json to name).
            idx += 2;
            continue;
        };
        let lone = match unit {
            0xD800..=0xDBFF => {
                let paired = escaped_unit(json, idx + 6).is_some_and(is_low);
                if paired {
                    idx += 12;
                    continue;
                }
                true
            }
            low => is_low(low),
        };
        if lone {
            fixed.get_or_insert_with(|| json.to_vec())[idx + 2..idx + 6].copy_from_slice(b"FFFD");
        }
        idx += 6;
    }
    fixed.map_or(Cow::Borrowed(json), Cow::Owned)
}

fn is_low(unit: u16) -> bool {
    (0xDC00..=0xDFFF).contains(&unit)
}

/// The code unit of the `\uXXXX` escape at `idx`, if one is there.
fn escaped_unit(json: &[u8], idx: usize) -> Option<u16> {
    let escape = json.get(idx..idx + 6)?;
    if &escape[..2] != b"\\u" {
        return None;
    }
    let hex = std::str::from_utf8(&escape[2..]).ok()?;
    u16::from_str_radix(hex, 16)
        .ok()
        .filter(|_| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::replace_lone_surrogates;

    fn check(json: &str, expected: &str) {
        let fixed = replace_lone_surrogates(json.as_bytes());
        assert_eq!(std::str::from_utf8(&fixed).unwrap(), expected, "{json}");
    }

    #[test]
    fn lone_halves_become_the_replacement_character() {
        check(r#""\ud800""#, r#""\uFFFD""#);
        check(r#""a\uDBFFb""#, r#""a\uFFFDb""#);
        check(r#""\udc00""#, r#""\uFFFD""#);
        check(r#""\ud800\ud800""#, r#""\uFFFD\uFFFD""#);
        check(r#""\udc00\ud800""#, r#""\uFFFD\uFFFD""#);
        check(r#"["\ud83d", "x\ude00"]"#, r#"["\uFFFD", "x\uFFFD"]"#);
        let value: serde_json::Value =
            serde_json::from_slice(&replace_lone_surrogates(br#"{"s": "a\ud800b"}"#)).unwrap();
        assert_eq!(value["s"], "a\u{FFFD}b");
    }

    #[test]
    fn pairs_other_escapes_and_plain_text_are_kept() {
        for json in [
            r#""\ud83d\ude00""#,
            r#""\\ud800""#,
            r#""\\\"\u0041x""#,
            r#""\u00e9 é \n \" \/""#,
            r#""\ud8""#,
            r#""\u""#,
            "\\",
            "",
        ] {
            assert!(
                matches!(
                    replace_lone_surrogates(json.as_bytes()),
                    std::borrow::Cow::Borrowed(_)
                ),
                "{json}"
            );
        }
        // An escaped backslash before a real lone escape.
        check(r#""\\\ud800""#, r#""\\\uFFFD""#);
    }
}
