//! GBNF, llama.cpp's grammar format (`root ::= ...`: what llama-server's
//! `grammar` field and llama.cpp's `--grammar-file` take), read and
//! translated into llguidance's Lark dialect, so a GBNF grammar compiles
//! through the same engine as every other [`OutputFormat`](crate::OutputFormat).
//!
//! The syntax is llama.cpp's `grammars/README.md`: rules `name ::= ...`
//! (names of letters, digits, `-` and `_`; used before or after their
//! definition), `root` as the start, alternatives `|`, groups `( )`,
//! `* + ?`, `{m}`, `{m,}`, `{m,n}` (stacked, as in `x+?`), string literals
//! and character classes `[a-z]`, `[^...]` with the escapes `\n \t \r \\
//! \" \[ \] \- \xHH \uHHHH \UHHHHHHHH`, `.` for any character, `#`
//! comments, and tokens `<[id]>`, `!<[id]>`, `<name>` (a special token).
//! A newline ends a rule except inside parentheses or after `|`, as in
//! llama.cpp. Two departures, both errors where llama.cpp is silent: a rule
//! defined twice (llama.cpp keeps the last) and a repetition count above
//! 2000 (llama.cpp drops a maximum above 2000).
//!
//! The translation is exact: GBNF matches characters, and so does the
//! Lark it becomes, one character per lexeme (a literal `"ab"` becomes
//! `"a" "b"`, a class a one-character regex, `.` any one character), all
//! structure in Lark rules. llguidance's lexer is greedy (a lexeme is
//! extended while it can be), which would make a Lark literal `"ab"` win
//! over `"a"` followed by `"b"`; with lexemes of one character nothing can
//! be extended, so the lexer never chooses and the parser sees exactly
//! GBNF's language. Each group becomes a rule of its own, as llama.cpp
//! makes one (llguidance's Lark parser takes 30 levels of parentheses).
//! GBNF names become Lark rule names (lowercase): a name
//! of lowercase letters, digits and dashes other than `start` is kept,
//! any other is written `g_` followed by the name with each capital `X` as
//! `_x` and each `_` as `__`, so two names never meet.

use std::collections::HashMap;
use std::fmt::Write as _;

/// The largest count a repetition `{m,n}` may give (llama.cpp's limit).
pub(crate) const MAX_REPETITION: u32 = 2000;

/// The deepest nesting of groups and stacked repetitions.
pub(crate) const MAX_NESTING: usize = 64;

/// A GBNF text that cannot be translated; lines and columns count from 1
/// (columns in characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GbnfError {
    /// The text does not parse.
    #[error("GBNF syntax error at line {line}, column {column}: {message}")]
    Syntax {
        /// Where the error is.
        line: usize,
        /// Where the error is.
        column: usize,
        /// What was expected or found.
        message: String,
    },
    /// A rule is used but never defined.
    #[error("GBNF rule '{name}' is used at line {line}, column {column} but never defined")]
    UndefinedRule {
        /// The rule's name.
        name: String,
        /// Where it is first used.
        line: usize,
        /// Where it is first used.
        column: usize,
    },
    /// A rule is defined twice.
    #[error("GBNF rule '{name}' is defined twice (again at line {line})")]
    DuplicateRule {
        /// The rule's name.
        name: String,
        /// Where the second definition is.
        line: usize,
    },
    /// No rule is named `root`, the start of the output.
    #[error("the GBNF grammar has no 'root' rule (the start of the output)")]
    NoRoot,
    /// A repetition count above the limit (2000, as llama.cpp's).
    #[error(
        "GBNF repetition count {count} at line {line}, column {column} is above the limit of {max}"
    )]
    RepetitionTooLarge {
        /// The count given.
        count: u64,
        /// The limit.
        max: u32,
        /// Where the count is.
        line: usize,
        /// Where the count is.
        column: usize,
    },
    /// A rule reached from `root` through more nested rules, groups and
    /// repetitions than the limit (128): llguidance compiles a grammar by
    /// recursion, so a longer chain would overflow its stack.
    #[error(
        "GBNF rule '{name}' is reached from root through more than {max} nested rules and groups"
    )]
    ChainTooDeep {
        /// The rule past the limit.
        name: String,
        /// The limit.
        max: usize,
    },
    /// Groups or stacked repetitions nested deeper than the limit (64).
    #[error("GBNF nesting at line {line}, column {column} is deeper than the limit of {max}")]
    TooDeep {
        /// The limit.
        max: usize,
        /// Where the limit was passed.
        line: usize,
        /// Where the limit was passed.
        column: usize,
    },
}

/// Whether `text` is a GBNF grammar rather than a Lark one: its first rule
/// (after blank lines and `#` comments) is `name ::=`. A Lark grammar's is
/// `name:` (or a `%` directive), so the two never look alike.
///
/// ```
/// assert!(lm::is_gbnf("# digits\nroot ::= [0-9]+"));
/// assert!(!lm::is_gbnf("start: /[0-9]+/"));
/// ```
pub fn is_gbnf(text: &str) -> bool {
    let mut parser = Parser::new(text);
    parser.skip_space(true);
    let start = parser.pos;
    parser.eat_while(is_name_char);
    if parser.pos == start {
        return false;
    }
    parser.skip_space(false);
    parser.rest().starts_with("::=")
}

/// `gbnf` translated into llguidance's Lark dialect (whose start rule is
/// `start`); `gbnf.rs`'s module documentation says how.
///
/// ```
/// let lark = lm::gbnf_to_lark("root ::= (\"hi\" | \"yo\") [0-9]{2}").unwrap();
/// assert_eq!(
///     lark,
///     "start: root\nroot: h_0 /[\\x{30}-\\x{39}]/{2}\nh_0: \"h\" \"i\" | \"y\" \"o\"\n"
/// );
/// ```
pub fn gbnf_to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let rules = Parser::new(gbnf).grammar()?;
    let mut lines: HashMap<&str, usize> = HashMap::new();
    for rule in &rules {
        if lines.insert(&rule.name, rule.pos).is_some() {
            return Err(GbnfError::DuplicateRule {
                name: rule.name.clone(),
                line: location(gbnf, rule.pos).0,
            });
        }
    }
    for rule in &rules {
        for alternative in &rule.body {
            for node in alternative {
                node.check_refs(&lines, gbnf)?;
            }
        }
    }
    if !lines.contains_key("root") {
        return Err(GbnfError::NoRoot);
    }
    Chain::new(&rules).visit_rule("root", 1)?;
    let mut lark = format!("start: {}\n", lark_name("root"));
    let mut writer = Writer::default();
    for rule in &rules {
        lark.push_str(&lark_name(&rule.name));
        lark.push_str(": ");
        writer.alternatives(&rule.body, &mut lark);
        lark.push('\n');
    }
    for (index, body) in writer.made.iter().enumerate() {
        let _ = writeln!(lark, "h_{index}: {body}");
    }
    Ok(lark)
}

/// The deepest chain of rules through rules, groups and repetitions (each
/// of the latter two may become a Lark rule) that llguidance's compiler
/// enters by recursion from the start.
pub(crate) const MAX_CHAIN: usize = 128;

/// A walk from `root` in the order llguidance's compiler takes (each rule
/// entered where it is first used), measuring how deep it goes.
struct Chain<'r> {
    rules: HashMap<&'r str, &'r Rule>,
    entered: std::collections::HashSet<&'r str>,
}

impl<'r> Chain<'r> {
    fn new(rules: &'r [Rule]) -> Self {
        Self {
            rules: rules
                .iter()
                .map(|rule| (rule.name.as_str(), rule))
                .collect(),
            entered: std::collections::HashSet::new(),
        }
    }

    fn visit_rule(&mut self, name: &'r str, depth: usize) -> Result<(), GbnfError> {
        if !self.entered.insert(name) {
            return Ok(());
        }
        let rule = self.rules[name];
        self.visit_alternatives(&rule.body, name, depth)
    }

    fn visit_alternatives(
        &mut self,
        alternatives: &'r [Vec<Node>],
        name: &'r str,
        depth: usize,
    ) -> Result<(), GbnfError> {
        if depth > MAX_CHAIN {
            return Err(GbnfError::ChainTooDeep {
                name: name.to_owned(),
                max: MAX_CHAIN,
            });
        }
        for node in alternatives.iter().flatten() {
            self.visit_node(node, name, depth)?;
        }
        Ok(())
    }

    fn visit_node(&mut self, node: &'r Node, name: &'r str, depth: usize) -> Result<(), GbnfError> {
        match node {
            Node::Ref { name, .. } => self.visit_rule(name, depth + 1),
            Node::Group(alternatives) => self.visit_alternatives(alternatives, name, depth + 1),
            Node::Repeat { node, .. } => {
                if depth + 1 > MAX_CHAIN {
                    return Err(GbnfError::ChainTooDeep {
                        name: name.to_owned(),
                        max: MAX_CHAIN,
                    });
                }
                self.visit_node(node, name, depth + 1)
            }
            _ => Ok(()),
        }
    }
}

/// A rule: its name, its alternatives and the byte offset it starts at.
struct Rule {
    name: String,
    body: Vec<Vec<Node>>,
    pos: usize,
}

/// One item of a sequence.
enum Node {
    /// These characters in order (`""` is the empty string).
    Literal(String),
    /// One character in (or, negated, outside) these inclusive ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// Any one character.
    Any,
    /// Another rule, where it is used.
    Ref { name: String, pos: usize },
    /// A token by id (`<[id]>`, or any other token when negated).
    TokenId { id: u32, negated: bool },
    /// A special token by name (`<name>`).
    TokenName(String),
    /// A parenthesised group of alternatives.
    Group(Vec<Vec<Node>>),
    /// `node` from `min` to `max` times (no `max`: unbounded).
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

impl Node {
    fn check_refs(&self, defined: &HashMap<&str, usize>, src: &str) -> Result<(), GbnfError> {
        match self {
            Self::Ref { name, pos } if !defined.contains_key(name.as_str()) => {
                let (line, column) = location(src, *pos);
                Err(GbnfError::UndefinedRule {
                    name: name.clone(),
                    line,
                    column,
                })
            }
            Self::Group(alternatives) => alternatives
                .iter()
                .flatten()
                .try_for_each(|node| node.check_refs(defined, src)),
            Self::Repeat { node, .. } => node.check_refs(defined, src),
            _ => Ok(()),
        }
    }
}

/// Writes GBNF rules as Lark rules. Each group, and each repeated item
/// that is more than one lexeme, becomes a rule of its own (`h_N`: no GBNF
/// name maps there), so no Lark rule nests parentheses: llguidance's Lark
/// parser takes 30 levels, and grammars made by llama.cpp's JSON Schema
/// converter nest deeper.
#[derive(Default)]
struct Writer {
    /// The bodies of the rules made so far; rule `h_N` is `made[N]`.
    made: Vec<String>,
}

impl Writer {
    fn alternatives(&mut self, alternatives: &[Vec<Node>], out: &mut String) {
        for (i, sequence) in alternatives.iter().enumerate() {
            if i > 0 {
                out.push_str(" | ");
            }
            if sequence.is_empty() {
                out.push_str("\"\"");
            }
            for (j, node) in sequence.iter().enumerate() {
                if j > 0 {
                    out.push(' ');
                }
                self.node(node, out);
            }
        }
    }

    fn node(&mut self, node: &Node, out: &mut String) {
        match node {
            Node::Literal(text) if text.is_empty() => out.push_str("\"\""),
            Node::Literal(text) => {
                for (i, c) in text.chars().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    out.push_str(&lark_string(c.encode_utf8(&mut [0; 4])));
                }
            }
            Node::Class { negated, ranges } => {
                out.push_str(if *negated { "/[^" } else { "/[" });
                for &(first, last) in ranges {
                    write_regex_char(first, out);
                    if last != first {
                        out.push('-');
                        write_regex_char(last, out);
                    }
                }
                out.push_str("]/");
            }
            Node::Any => out.push_str(r"/[\x{0}-\x{10FFFF}]/"),
            Node::Ref { name, .. } => out.push_str(&lark_name(name)),
            Node::TokenId { id, negated } => {
                let _ = write!(out, "<[{}{id}]>", if *negated { "^" } else { "" });
            }
            Node::TokenName(name) => {
                let _ = write!(out, "<{name}>");
            }
            Node::Group(alternatives) => {
                let name = self.rule_of(|writer, body| writer.alternatives(alternatives, body));
                out.push_str(&name);
            }
            // Nothing, any number of times, or anything no times.
            Node::Repeat { max: Some(0), .. } => out.push_str("\"\""),
            Node::Repeat { node, .. } if matches!(**node, Node::Literal(ref t) if t.is_empty()) => {
                out.push_str("\"\"")
            }
            Node::Repeat { node, min, max } => {
                let one_lexeme = match &**node {
                    Node::Literal(text) => text.chars().count() == 1,
                    Node::Group(_) | Node::Repeat { .. } => false,
                    _ => true,
                };
                if one_lexeme {
                    self.node(node, out);
                } else {
                    let name = self.rule_of(|writer, body| writer.node(node, body));
                    out.push_str(&name);
                }
                let _ = match (min, max) {
                    (0, None) => write!(out, "*"),
                    (1, None) => write!(out, "+"),
                    (0, Some(1)) => write!(out, "?"),
                    (m, None) => write!(out, "{{{m},}}"),
                    (m, Some(n)) if m == n => write!(out, "{{{m}}}"),
                    (m, Some(n)) => write!(out, "{{{m},{n}}}"),
                };
            }
        }
    }

    /// A new rule whose body `write` writes, by name.
    fn rule_of(&mut self, write: impl FnOnce(&mut Self, &mut String)) -> String {
        let index = self.made.len();
        self.made.push(String::new());
        let mut body = String::new();
        write(self, &mut body);
        self.made[index] = body;
        format!("h_{index}")
    }
}

/// `text` as a Lark string literal: JSON's escapes, and the control
/// characters and DEL escaped (the Lark lexer takes none raw).
pub(crate) fn lark_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c < ' ' || c == '\x7f' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One character in a regex class, as `\x{HEX}` (nothing to escape).
fn write_regex_char(c: char, out: &mut String) {
    let _ = write!(out, "\\x{{{:X}}}", u32::from(c));
}

/// The Lark rule name of GBNF rule `name` (see the module documentation).
fn lark_name(name: &str) -> String {
    let plain = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name != "start"
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if plain {
        return name.to_owned();
    }
    let mut lark = String::from("g_");
    for c in name.chars() {
        match c {
            'A'..='Z' => {
                lark.push('_');
                lark.push(c.to_ascii_lowercase());
            }
            '_' => lark.push_str("__"),
            c => lark.push(c),
        }
    }
    lark
}

/// The line and column (from 1; columns in characters) of byte offset
/// `pos` in `src`.
fn location(src: &str, pos: usize) -> (usize, usize) {
    let before = &src[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// A recursive-descent reader of GBNF over the text, llama.cpp's grammar
/// in its own terms (`parse_rule`, `parse_alternates`, `parse_sequence`).
struct Parser<'a> {
    src: &'a str,
    pos: usize,
    /// Groups open and repetitions stacked, bounded by [`MAX_NESTING`].
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        Self {
            src,
            pos: 0,
            depth: 0,
        }
    }

    fn rest(&self) -> &'a str {
        &self.src[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn peek2(&self) -> Option<char> {
        self.rest().chars().nth(1)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// Takes `c` if it is next; whether it was.
    fn eat(&mut self, c: char) -> bool {
        let next = self.peek() == Some(c);
        if next {
            self.bump();
        }
        next
    }

    /// Whether the literal or class opened at `open` ends here with
    /// `close` (then taken); the end of the grammar before it is the error
    /// `unclosed`.
    fn closes(&mut self, open: usize, close: char, unclosed: &str) -> Result<bool, GbnfError> {
        match self.peek() {
            None => Err(self.error_at(open, unclosed)),
            Some(_) => Ok(self.eat(close)),
        }
    }

    fn eat_while(&mut self, keep: impl Fn(char) -> bool) {
        while self.peek().is_some_and(&keep) {
            self.bump();
        }
    }

    /// The line and column of byte offset `pos` (errors only: it reads
    /// the text from the start).
    fn location(&self, pos: usize) -> (usize, usize) {
        location(self.src, pos)
    }

    fn error_at(&self, pos: usize, message: impl Into<String>) -> GbnfError {
        let (line, column) = self.location(pos);
        GbnfError::Syntax {
            line,
            column,
            message: message.into(),
        }
    }

    fn error(&self, message: impl Into<String>) -> GbnfError {
        self.error_at(self.pos, message)
    }

    /// What is at the cursor, for a message.
    fn found(&self) -> String {
        self.peek()
            .map_or_else(|| "the end".to_owned(), |c| format!("{c:?}"))
    }

    /// Skips spaces, tabs and `#` comments, and newlines if `newlines`.
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.bump();
                }
                '\r' | '\n' if newlines => {
                    self.bump();
                }
                '#' => self.eat_while(|c| c != '\r' && c != '\n'),
                _ => break,
            }
        }
    }

    fn grammar(&mut self) -> Result<Vec<Rule>, GbnfError> {
        let mut rules = Vec::new();
        self.skip_space(true);
        while self.peek().is_some() {
            rules.push(self.rule()?);
        }
        Ok(rules)
    }

    fn rule(&mut self) -> Result<Rule, GbnfError> {
        let pos = self.pos;
        let name = self.name()?;
        self.skip_space(false);
        if !self.rest().starts_with("::=") {
            return Err(self.error(format!(
                "expected '::=' after the rule name '{name}', found {}",
                self.found()
            )));
        }
        self.pos += 3;
        self.skip_space(true);
        let body = self.alternatives(false)?;
        match self.peek() {
            None => {}
            Some('\n') => {
                self.bump();
            }
            Some('\r') => {
                self.bump();
                self.eat('\n');
            }
            Some(_) => {
                return Err(self.error(format!(
                    "expected a newline or the end after rule '{name}', found {}",
                    self.found()
                )));
            }
        }
        self.skip_space(true);
        Ok(Rule { name, body, pos })
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        self.eat_while(is_name_char);
        if self.pos == start {
            return Err(self.error(format!("expected a rule name, found {}", self.found())));
        }
        Ok(self.src[start..self.pos].to_owned())
    }

    /// Sequences separated by `|`; a newline after `|` continues them.
    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Node>>, GbnfError> {
        let mut alternatives = vec![self.sequence(nested)?];
        while self.eat('|') {
            self.skip_space(true);
            alternatives.push(self.sequence(nested)?);
        }
        Ok(alternatives)
    }

    /// Items up to `|`, `)`, or (outside parentheses) the end of the line.
    fn sequence(&mut self, nested: bool) -> Result<Vec<Node>, GbnfError> {
        let mut items: Vec<Node> = Vec::new();
        // Repetitions stacked on the last item (`x+?`), counted as nesting.
        let mut stacked = 0;
        loop {
            let start = self.pos;
            let item = match self.peek() {
                Some('"') => self.literal()?,
                Some('[') => self.class()?,
                Some('<' | '!') => self.token()?,
                Some('.') => {
                    self.bump();
                    Node::Any
                }
                Some('(') => {
                    self.bump();
                    self.enter(start)?;
                    self.skip_space(true);
                    let alternatives = self.alternatives(true)?;
                    if self.peek() != Some(')') {
                        return Err(self.error(format!("expected ')', found {}", self.found())));
                    }
                    self.bump();
                    self.depth -= 1;
                    Node::Group(alternatives)
                }
                Some(c) if is_name_char(c) => Node::Ref {
                    name: self.name()?,
                    pos: start,
                },
                Some('*' | '+' | '?' | '{') => {
                    let (min, max) = self.repetition()?;
                    let Some(node) = items.pop() else {
                        return Err(self.error_at(start, "a repetition with nothing before it"));
                    };
                    stacked += 1;
                    if self.depth + stacked > MAX_NESTING {
                        return Err(self.too_deep(start));
                    }
                    items.push(Node::Repeat {
                        node: Box::new(node),
                        min,
                        max,
                    });
                    self.skip_space(nested);
                    continue;
                }
                _ => break,
            };
            stacked = 0;
            items.push(item);
            self.skip_space(nested);
        }
        Ok(items)
    }

    fn enter(&mut self, start: usize) -> Result<(), GbnfError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(self.too_deep(start));
        }
        Ok(())
    }

    /// The error of nesting deeper than [`MAX_NESTING`] at `start`.
    fn too_deep(&self, start: usize) -> GbnfError {
        let (line, column) = self.location(start);
        GbnfError::TooDeep {
            max: MAX_NESTING,
            line,
            column,
        }
    }

    /// `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}`: the minimum and maximum.
    fn repetition(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        match self.bump() {
            Some('*') => return Ok((0, None)),
            Some('+') => return Ok((1, None)),
            Some('?') => return Ok((0, Some(1))),
            _ => {}
        }
        // `{`: spaces may stand between the parts, as in llama.cpp.
        self.skip_space(false);
        let min = self.count()?;
        self.skip_space(false);
        let max = match self.bump() {
            Some('}') => Some(min),
            Some(',') => {
                self.skip_space(false);
                let max = if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    Some(self.count()?)
                } else {
                    None
                };
                self.skip_space(false);
                if self.bump() != Some('}') {
                    return Err(self.error_at(
                        self.pos.saturating_sub(1),
                        "expected '}' to close the repetition",
                    ));
                }
                max
            }
            _ => {
                return Err(self.error_at(
                    self.pos.saturating_sub(1),
                    "expected ',' or '}' in the repetition",
                ));
            }
        };
        if let Some(max) = max
            && max < min
        {
            return Err(self.error(format!(
                "the repetition's maximum {max} is below its minimum {min}"
            )));
        }
        Ok((min, max))
    }

    /// A decimal count no larger than [`MAX_REPETITION`].
    fn count(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        self.eat_while(|c| c.is_ascii_digit());
        let digits = &self.src[start..self.pos];
        if digits.is_empty() {
            return Err(self.error(format!("expected a number, found {}", self.found())));
        }
        // Any run of digits: saturate instead of overflowing, then refuse.
        let count = digits.bytes().fold(0u64, |n, d| {
            n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
        });
        match u32::try_from(count) {
            Ok(count) if count <= MAX_REPETITION => Ok(count),
            _ => {
                let (line, column) = self.location(start);
                Err(GbnfError::RepetitionTooLarge {
                    count,
                    max: MAX_REPETITION,
                    line,
                    column,
                })
            }
        }
    }

    /// `"..."` with escapes.
    fn literal(&mut self) -> Result<Node, GbnfError> {
        let open = self.pos;
        self.bump();
        let mut text = String::new();
        while !self.closes(open, '"', "a string literal that is not closed")? {
            text.push(self.char()?);
        }
        Ok(Node::Literal(text))
    }

    /// `[...]` or `[^...]`: characters and ranges `a-z`; a `-` before `]`
    /// is itself.
    fn class(&mut self) -> Result<Node, GbnfError> {
        let open = self.pos;
        self.bump();
        let negated = self.eat('^');
        let mut ranges = Vec::new();
        while !self.closes(open, ']', "a character class that is not closed")? {
            let first = self.char()?;
            let mut last = first;
            if self.peek() == Some('-') && self.peek2().is_some_and(|c| c != ']') {
                let dash = self.pos;
                self.bump();
                last = self.char()?;
                if last < first {
                    return Err(
                        self.error_at(dash, format!("the range {first:?}-{last:?} is reversed"))
                    );
                }
            }
            ranges.push((first, last));
        }
        if ranges.is_empty() {
            return Err(self.error_at(open, "an empty character class"));
        }
        Ok(Node::Class { negated, ranges })
    }

    /// One character of a literal or class, escapes read.
    fn char(&mut self) -> Result<char, GbnfError> {
        let start = self.pos;
        let c = self
            .bump()
            .ok_or_else(|| self.error("unexpected end of the grammar"))?;
        if c != '\\' {
            return Ok(c);
        }
        let digits = match self.bump() {
            Some('x') => 2,
            Some('u') => 4,
            Some('U') => 8,
            Some('n') => return Ok('\n'),
            Some('t') => return Ok('\t'),
            Some('r') => return Ok('\r'),
            Some(c @ ('\\' | '"' | '[' | ']' | '-')) => return Ok(c),
            _ => return Err(self.error_at(start, "an unknown escape")),
        };
        let hex_start = self.pos;
        for _ in 0..digits {
            if !self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                return Err(self.error(format!("expected {digits} hex digits in the escape")));
            }
            self.bump();
        }
        let value = u32::from_str_radix(&self.src[hex_start..self.pos], 16)
            .expect("only hex digits were taken");
        char::from_u32(value).ok_or_else(|| {
            self.error_at(start, format!("U+{value:X} is not a Unicode scalar value"))
        })
    }

    /// `<[id]>`, `!<[id]>` or `<name>`.
    fn token(&mut self) -> Result<Node, GbnfError> {
        let start = self.pos;
        let negated = self.eat('!');
        if self.bump() != Some('<') {
            return Err(self.error_at(self.pos.saturating_sub(1), "expected '<' after '!'"));
        }
        if self.peek() == Some('[') {
            self.bump();
            let digits = self.pos;
            self.eat_while(|c| c.is_ascii_digit());
            let id = self.src[digits..self.pos]
                .parse::<u32>()
                .map_err(|_| self.error_at(digits, "expected a token id in '<[...]>'"))?;
            if !self.rest().starts_with("]>") {
                return Err(self.error(format!("expected ']>', found {}", self.found())));
            }
            self.pos += 2;
            return Ok(Node::TokenId { id, negated });
        }
        let name_start = self.pos;
        self.eat_while(|c| c != '>');
        if self.peek() != Some('>') {
            return Err(self.error_at(start, "a token '<...>' that is not closed"));
        }
        let name = &self.src[name_start..self.pos];
        self.bump();
        if negated {
            return Err(self.error_at(
                start,
                "a negated token must be given by id ('!<[id]>'), not by text",
            ));
        }
        if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '<') {
            return Err(self.error_at(start, format!("'<{name}>' is not a token name")));
        }
        Ok(Node::TokenName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OutputFormat;

    /// Checks that GBNF `gbnf`, compiled by the engine, takes each of `yes`
    /// whole and refuses each of `no`.
    fn check(gbnf: &str, yes: &[&str], no: &[&str]) {
        let lark = gbnf_to_lark(gbnf).unwrap_or_else(|e| panic!("{gbnf:?}: {e}"));
        let format = OutputFormat::Gbnf(gbnf.into());
        for text in yes {
            assert_eq!(format.accepts(text), Ok(true), "{text:?} under\n{lark}");
        }
        for text in no {
            assert_eq!(format.accepts(text), Ok(false), "{text:?} under\n{lark}");
        }
    }

    #[test]
    fn rules_alternatives_and_groups_with_rules_used_before_they_are_defined() {
        check(
            "root ::= greeting \" \" name\nname ::= \"bob\" | \"al-ice\"\ngreeting ::= (\"hi\" | \"hello\")",
            &["hi bob", "hello al-ice"],
            &["hi", "hey bob", "hi bobx", "hi  bob", ""],
        );
    }

    #[test]
    fn repetitions_each_form_and_stacked() {
        check(
            "root ::= \"a\"* \"b\"+ \"c\"? \"d\"{2} \"e\"{1,} \"f\"{0,2} \"g\"{ 1 , 2 }",
            &["bddeg", "aabbcddeeeffgg", "bcddefg"],
            &["bdg", "bddg", "bddefffg", "bddeggg", "bddee", "abcdde"],
        );
        check("root ::= (\"ab\"+)?", &["", "ab", "abab"], &["a", "aba"]);
        check("root ::= \"ab\"+?", &["", "abab"], &["aba"]);
        check("root ::= \"x\"{0}", &[""], &["x"]);
        check("root ::= [0-9]{3,3}", &["123"], &["12", "1234"]);
    }

    #[test]
    fn literals_take_every_escape() {
        check(
            r#"root ::= "a\n\t\r\\\"\[\]\-\x41\u00e9\U0001F600" "é""#,
            &["a\n\t\r\\\"[]-Aé😀é"],
            &["a", "a\n\t\r\\\"[]-Aé😀"],
        );
        check(r#"root ::= "" "x" """#, &["x"], &["", "xx"]);
        // DEL and control characters reach the engine escaped.
        check(r#"root ::= "\x7f\x00\x1f""#, &["\x7f\0\x1f"], &["\x7f"]);
    }

    #[test]
    fn character_classes_ranges_negation_and_escapes() {
        check(
            r"root ::= [a-cx] [^a-c] [\]\-\\] [a-] [-z] [\x41-\x43\u00e9]",
            &["ad]a-A", "x\n-a-é", "cé\\-zB"],
            &["dd]a-A", "aa]a-A", "ad^a-A", "ad]b-A", "ad]aaA", "ad]a-D"],
        );
        // A negated class takes any character but its own, newlines and
        // four-byte characters included.
        check(
            "root ::= [^\"]+",
            &["a\nb", "😀", "é\"x"[..2].as_ref()],
            &["\"", ""],
        );
        check("root ::= [[^]", &["[", "^"], &["]"]);
    }

    #[test]
    fn any_character_is_one_character_of_any_length() {
        check(
            "root ::= . \"x\"",
            &["ax", "\nx", "éx", "😀x", "\"x"],
            &["x", "abx", "aax"],
        );
    }

    #[test]
    fn comments_newlines_and_crlf_as_llama_cpp_reads_them() {
        let gbnf = "# a grammar\r\n\r\nroot ::= (\r\n  \"a\" # first\r\n  | \"b\"\r\n) tail # after\r\ntail ::= \"c\" |\n  \"d\"\n# the end";
        check(gbnf, &["ac", "bd"], &["a", "c", "abc"]);
        // Outside parentheses a newline ends the rule; `|` on the next line
        // starts nothing.
        assert!(matches!(
            gbnf_to_lark("root ::= \"a\"\n  | \"b\""),
            Err(GbnfError::Syntax {
                line: 2,
                column: 3,
                ..
            })
        ));
    }

    #[test]
    fn names_with_dashes_digits_underscores_and_capitals_never_meet() {
        check(
            "root ::= a_b a-b A-b start 9lives\na_b ::= \"1\"\na-b ::= \"2\"\nA-b ::= \"3\"\nstart ::= \"4\"\n9lives ::= \"5\"",
            &["12345"],
            &["11345", "22345", "12245"],
        );
        for (gbnf, lark) in [
            ("a-b", "a-b"),
            ("move2", "move2"),
            ("a_b", "g_a__b"),
            ("A-b", "g__a-b"),
            ("start", "g_start"),
            ("9lives", "g_9lives"),
            ("g_a__b", "g_g__a____b"),
        ] {
            assert_eq!(lark_name(gbnf), lark, "{gbnf}");
        }
    }

    /// llguidance's lexer extends a lexeme while it can; one character per
    /// lexeme keeps GBNF's language (these fail with whole-literal lexemes).
    #[test]
    fn a_longer_lexeme_never_hides_a_shorter_parse() {
        check(
            "root ::= x \"b\"\nx ::= \"a\" | \"ab\"",
            &["ab", "abb"],
            &["a", "abbb"],
        );
        check("root ::= [a-z]+ \"s\"", &["cats", "ss"], &["cat", "s"]);
        check(
            "root ::= (\"a\" | \"ab\") (\"bc\" | \"c\")",
            &["abc", "abbc", "ac"],
            &["ab", "abcc"],
        );
    }

    #[test]
    fn tokens_by_id_negated_and_by_name() {
        // In the test vocabulary of single bytes, token 97 is "a".
        check("root ::= <[97]> \"b\"", &["ab"], &["bb", "b"]);
        check("root ::= !<[97]>", &["b", "z"], &["a", "", "bb"]);
        assert_eq!(
            gbnf_to_lark("root ::= <[5]> !<[6]> <|im_end|>").unwrap(),
            "start: root\nroot: <[5]> <[^6]> <|im_end|>\n"
        );
    }

    #[test]
    fn what_does_not_translate_is_a_typed_error_with_its_place() {
        let syntax = |line, column| move |e: &GbnfError| matches!(e, GbnfError::Syntax { line: l, column: c, .. } if (*l, *c) == (line, column));
        type Expected = Box<dyn Fn(&GbnfError) -> bool>;
        let cases: Vec<(&str, Expected)> = vec![
            ("root ::= \"a", Box::new(syntax(1, 10))),
            ("root ::= [a-", Box::new(syntax(1, 10))),
            ("root = \"a\"", Box::new(syntax(1, 6))),
            ("root ::= \"a\" )", Box::new(syntax(1, 14))),
            ("root ::= (\"a\"", Box::new(syntax(1, 14))),
            ("root ::=\n  * \"a\"", Box::new(syntax(2, 3))),
            ("root ::= \"\\q\"", Box::new(syntax(1, 11))),
            ("root ::= \"\\x4\"", Box::new(syntax(1, 14))),
            ("root ::= \"\\uD800\"", Box::new(syntax(1, 11))),
            ("root ::= []", Box::new(syntax(1, 10))),
            ("root ::= [z-a]", Box::new(syntax(1, 12))),
            ("root ::= \"a\"{3,1}", Box::new(syntax(1, 18))),
            ("root ::= \"a\"{3 x}", Box::new(syntax(1, 16))),
            ("root ::= !<x>", Box::new(syntax(1, 10))),
            ("root ::= <[x]>", Box::new(syntax(1, 12))),
            ("root ::= \"a\"\n€ ::= \"b\"", Box::new(syntax(2, 1))),
            (
                "root ::= a\n\na ::= b c\nb ::= \"b\"",
                Box::new(|e: &GbnfError| {
                    *e == GbnfError::UndefinedRule {
                        name: "c".into(),
                        line: 3,
                        column: 9,
                    }
                }),
            ),
            (
                "foo ::= \"a\"",
                Box::new(|e: &GbnfError| *e == GbnfError::NoRoot),
            ),
            ("", Box::new(|e: &GbnfError| *e == GbnfError::NoRoot)),
            (
                "root ::= \"a\"\nroot ::= \"b\"",
                Box::new(|e: &GbnfError| {
                    *e == GbnfError::DuplicateRule {
                        name: "root".into(),
                        line: 2,
                    }
                }),
            ),
            (
                "root ::= \"a\"{2001}",
                Box::new(|e: &GbnfError| {
                    *e == GbnfError::RepetitionTooLarge {
                        count: 2001,
                        max: 2000,
                        line: 1,
                        column: 14,
                    }
                }),
            ),
            (
                "root ::= \"a\"{0,99999999999999999999999999}",
                Box::new(|e: &GbnfError| {
                    matches!(
                        e,
                        GbnfError::RepetitionTooLarge {
                            count: u64::MAX,
                            ..
                        }
                    )
                }),
            ),
        ];
        for (gbnf, expected) in cases {
            let error = gbnf_to_lark(gbnf).unwrap_err();
            assert!(expected(&error), "{gbnf:?}: {error:?}");
            // The same error reaches a front end through the format.
            let refused = OutputFormat::Gbnf(gbnf.into()).check().unwrap_err();
            assert_eq!(refused.message, error.to_string());
        }
    }

    #[test]
    fn hostile_nesting_is_an_error_not_a_stack_overflow() {
        let deep = format!(
            "root ::= {}\"a\"{}",
            "(".repeat(100_000),
            ")".repeat(100_000)
        );
        assert!(matches!(
            gbnf_to_lark(&deep),
            Err(GbnfError::TooDeep { max: 64, .. })
        ));
        let stacked = format!("root ::= \"a\"{}", "?".repeat(100_000));
        assert!(matches!(
            gbnf_to_lark(&stacked),
            Err(GbnfError::TooDeep { max: 64, .. })
        ));
        // At the limit it translates and the engine compiles it.
        let at_limit = format!("root ::= {}\"a\"{}", "(".repeat(64), ")".repeat(64));
        check(&at_limit, &["a"], &["", "aa"]);
        // Counts at the limit, nested, stay small for the engine.
        check("root ::= ((\"a\"{2000}){2000}){0,2000}", &[""], &["a"]);
    }

    /// llguidance compiles rules by recursion: a long chain of rules is
    /// refused before it reaches the engine.
    #[test]
    fn hostile_chains_of_rules_are_an_error_not_a_stack_overflow() {
        let chain = |n: usize| {
            let mut gbnf = String::from("root ::= r0\n");
            for i in 0..n {
                gbnf.push_str(&format!("r{i} ::= r{} \"a\" | \"b\"\n", i + 1));
            }
            gbnf + &format!("r{n} ::= \"c\"\n")
        };
        // Within the limit it compiles (on a test thread's 2 MiB stack).
        let c_then_100 = format!("c{}", "a".repeat(100));
        check(
            &chain(100),
            &["b", "ba", &c_then_100],
            &["a", "cb", "caaaa"],
        );
        let error = gbnf_to_lark(&chain(100_000)).unwrap_err();
        assert_eq!(
            error,
            GbnfError::ChainTooDeep {
                name: "r127".into(),
                max: 128
            }
        );
        let cycle = "root ::= a\na ::= b \"x\" | \"y\"\nb ::= a \"z\" | root";
        check(cycle, &["y", "yzx"], &["x"]);
    }

    #[test]
    fn a_gbnf_grammar_is_told_from_a_lark_one_by_its_first_rule() {
        for (text, gbnf) in [
            ("root ::= \"a\"", true),
            ("# comment\n\n  root::=\"a\"", true),
            ("my-Rule_2 \t::= \"a\"", true),
            ("start: \"a\"", false),
            ("// a :: = comment\nstart: \"a\"", false),
            ("%llguidance {}\nstart: \"a\"", false),
            ("start: \"::=\"", false),
            ("", false),
        ] {
            assert_eq!(is_gbnf(text), gbnf, "{text:?}");
            let expected = if gbnf {
                OutputFormat::Gbnf(text.into())
            } else {
                OutputFormat::Lark(text.into())
            };
            assert_eq!(OutputFormat::from_grammar(text.into()), expected);
        }
    }

    fn fixture(name: &str) -> String {
        let path = format!("{}/../../fixtures/gbnf/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// llama.cpp's own example grammars (`fixtures/gbnf/`).
    #[test]
    fn llama_cpp_s_example_grammars_translate_compile_and_judge_samples() {
        check(
            &fixture("json.gbnf"),
            &[
                "{}",
                r#"{"a": [1, 2.5, -3e5, true, false, null, "x\"y\u00e9"], "b": {"c": []}}"#,
                "{\n  \"k\": \"v\"\n}",
            ],
            &[
                "[1]",
                r#"{"a": 01}"#,
                r#"{"a": "\x"}"#,
                r#"{"a" 1}"#,
                r#"{"a": tru}"#,
                "{",
            ],
        );
        check(
            &fixture("arithmetic.gbnf"),
            &["1+2=3\n", "(a*b)=c\nx = 2\n", "x_1 /(y -2)=z\n"],
            &["1+2=3", "=3\n", "A=1\n", "1+=2\n"],
        );
        check(
            &fixture("list.gbnf"),
            &["- milk\n", "- milk\n- eggs, bread\n"],
            &["- \n", "milk\n", "- a\rb\n", "- a\u{2028}b\n", "- milk"],
        );
        check(
            &fixture("chess.gbnf"),
            &[
                "1. e4 e5\n2. Nf3 Nc6\n",
                "1. d4 d5\n2. O-O-O Qxd8#\n10. exd8=Q+ Ke7\n",
            ],
            &[
                "1. e4 e5\n",
                "1. e9 e5\n2. d4 d5\n",
                "1. e4\n2. d4 d5\n",
                "1. e4 e5\n0. d4 d5\n",
            ],
        );
    }
}
