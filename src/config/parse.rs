//! Parsing: a configuration file's text to a generic tree of keys, in TOML
//! or YAML (JSON is YAML), whichever the name or the text says.
//!
//! It owns the format guess, the cost check that refuses text too large or
//! too deeply nested before it is parsed whole (`yaml_depth` reads YAML's
//! nesting as its parser does), duplicate keys (refused in
//! both formats, named in full), and syntax errors reported as one line with
//! its line and column. It must not know what any key means: the tree goes
//! to `raw` as it is.

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::{Map, Value};

use super::Problems;

/// The largest configuration file parsed, in bytes: real ones are a few
/// kilobytes, and parsing cost must stay small whatever the file holds.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;
/// The deepest nesting parsed: real files nest a few levels, and YAML and
/// TOML parsers spend time quadratic in the depth. In TOML, arrays and
/// inline tables (`[` and `{`); in YAML, every mapping and list, the
/// top-level one included.
pub const MAX_NESTING: usize = 32;

/// The two syntaxes a configuration file may be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    Toml,
    Yaml,
}

/// `.toml` is TOML; `.yaml`, `.yml` and `.json` (JSON is YAML) are YAML.
/// Any other name is TOML unless it fails to parse as TOML and reads like
/// YAML.
pub(super) fn detect_format(path: &Path, text: &str) -> Format {
    let extension = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("toml") => Format::Toml,
        Some("yaml" | "yml" | "json") => Format::Yaml,
        // Sniffing parses: input refused before parsing stays TOML, whose
        // parse then reports the refusal.
        _ if check_cost(Format::Toml, text).is_ok()
            && toml::from_str::<toml::Table>(text).is_err()
            && looks_like_yaml(text) =>
        {
            Format::Yaml
        }
        _ => Format::Toml,
    }
}

/// True when the first line that is neither blank nor a comment reads like
/// YAML (`key: value`, a `---` document start, a JSON object) rather than
/// TOML (`[section]`, `key = value`).
fn looks_like_yaml(text: &str) -> bool {
    let Some(line) = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
    else {
        return false;
    };
    if line.starts_with("---") || line.starts_with('{') {
        return true;
    }
    match line.split_once(':') {
        Some((key, rest)) => !key.contains(['=', '[', ' ']) && (rest.is_empty() || rest.starts_with([' ', '\t'])),
        None => false,
    }
}

/// Parses the text into a mapping of keys; a syntax error becomes one
/// problem with its line and column.
pub(super) fn parse(format: Format, text: &str, problems: &mut Problems) -> Option<Map<String, Value>> {
    if let Err(message) = check_cost(format, text) {
        problems.push("", message);
        return None;
    }
    let parsed = match format {
        Format::Toml => toml::from_str::<Value>(text).map_err(|err| toml_syntax_error(text, &err)),
        Format::Yaml => serde_yaml_ng::from_str::<Tree>(text)
            .map(|Tree(tree)| tree)
            .map_err(|err| yaml_syntax_error(text, &err)),
    };
    match parsed {
        Ok(Value::Object(map)) => Some(map),
        // A YAML file holding nothing but comments.
        Ok(Value::Null) => Some(Map::new()),
        Ok(other) => {
            problems.push(
                "",
                format!("expected a mapping of keys at the top level, found {other}"),
            );
            None
        }
        Err(message) => {
            problems.push("", message);
            None
        }
    }
}

/// Refuses, before the text is parsed whole, text that would cost a parser
/// far more than a configuration file should: more than [`MAX_FILE_BYTES`],
/// or nested deeper than [`MAX_NESTING`] (a daemon reloading on SIGHUP must
/// not spend seconds on a file of `[` characters).
fn check_cost(format: Format, text: &str) -> Result<(), String> {
    if text.len() > MAX_FILE_BYTES {
        return Err(format!(
            "the file is {} bytes, more than the maximum of {MAX_FILE_BYTES} (1 MiB)",
            text.len()
        ));
    }
    match format {
        Format::Toml => toml_nesting(text),
        Format::Yaml => match super::yaml_depth::too_deep(text, MAX_NESTING) {
            Some((line, column)) => Err(format!(
                "line {line}, column {column}: more than {MAX_NESTING} levels of nesting (mappings and lists)"
            )),
            None => Ok(()),
        },
    }
}

/// Refuses, in one linear pass, TOML whose `[` and `{` nest deeper than
/// [`MAX_NESTING`] outside strings and comments. TOML's strings are
/// unambiguous (a quote outside a string always opens one, and only a
/// triple-quoted one spans lines), so this reads them as the parser does.
fn toml_nesting(text: &str) -> Result<(), String> {
    let chars: Vec<char> = text.chars().collect();
    let triple = |at: usize, quote: char| {
        chars
            .get(at..at + 3)
            .is_some_and(|three| three.iter().all(|&c| c == quote))
    };
    let (mut depth, mut line, mut column) = (0usize, 1usize, 0usize);
    // The open string's quote and whether it is triple-quoted; only `"`
    // strings have escapes.
    let mut string: Option<(char, bool)> = None;
    let mut escaped = false;
    let mut comment = false;
    let mut at = 0;
    while let Some(&c) = chars.get(at) {
        // How many characters this step reads.
        let mut step = 1;
        column += 1;
        if c == '\n' {
            (line, column, comment) = (line + 1, 0, false);
        }
        match string {
            _ if comment => {}
            Some(('"', _)) if escaped => escaped = false,
            Some(('"', _)) if c == '\\' => escaped = true,
            // A single-line string ends at its quote or, unterminated (the
            // parser refuses it there), at the line's end.
            Some((quote, false)) if c == quote || c == '\n' => string = None,
            Some((quote, true)) if triple(at, quote) => {
                // Up to two more quotes belong to the string: `"""a""""`.
                step = 3;
                while step < 5 && chars.get(at + step) == Some(&quote) {
                    step += 1;
                }
                string = None;
            }
            Some(_) => {}
            None => match c {
                '#' => comment = true,
                '"' | '\'' if triple(at, c) => {
                    string = Some((c, true));
                    step = 3;
                }
                '"' | '\'' => string = Some((c, false)),
                '[' | '{' => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(format!(
                            "line {line}, column {column}: more than {MAX_NESTING} levels of nesting ([ and {{)"
                        ));
                    }
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        column += step - 1;
        at += step;
    }
    Ok(())
}

fn toml_syntax_error(text: &str, err: &toml::de::Error) -> String {
    let mut message = err.message().trim().replace('\n', "; ");
    match err.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
            if message == "duplicate key"
                && let Some(key) = toml_duplicate_key(text, span)
            {
                message = format!("duplicate key {key}");
            }
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

/// The full name of the key a TOML "duplicate key" error points at: the
/// key as written, under the `[table]` header above it (a repeated header
/// is named by itself).
fn toml_duplicate_key(text: &str, span: std::ops::Range<usize>) -> Option<String> {
    let key = text.get(span.clone())?.trim();
    let line_start = text.get(..span.start)?.rfind('\n').map_or(0, |at| at + 1);
    let line = text.get(line_start..)?.lines().next()?.trim_start();
    let header = |line: &str| -> Option<String> {
        let inner = line.trim().strip_prefix('[')?;
        let inner = inner.strip_prefix('[').unwrap_or(inner);
        let end = inner.find(']')?;
        Some(inner[..end].trim().to_string())
    };
    if line.starts_with('[') {
        return header(line);
    }
    let table = text
        .get(..line_start)?
        .lines()
        .rev()
        .find(|line| line.trim_start().starts_with('['))
        .and_then(header);
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_string(),
    })
}

/// A YAML document as a JSON tree, refusing a key that appears twice in
/// one mapping (plain deserialization keeps the last silently).
struct Tree(Value);

/// Deserializes a [`Tree`] under `path`, the dotted name of its mapping.
struct TreeSeed<'a>(&'a str);

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        de::DeserializeSeed::deserialize(TreeSeed(""), deserializer)
    }
}

impl<'de> de::DeserializeSeed<'de> for TreeSeed<'_> {
    type Value = Tree;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tree, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TreeSeed<'_> {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Tree, E> {
        Ok(Tree(Value::Bool(value)))
    }
    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Tree, E> {
        Ok(Tree(Value::from(value)))
    }
    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Tree, E> {
        Ok(Tree(Value::from(value)))
    }
    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Tree, E> {
        Ok(Tree(
            serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E: de::Error>(self, value: &str) -> Result<Tree, E> {
        Ok(Tree(Value::String(value.to_owned())))
    }
    fn visit_string<E: de::Error>(self, value: String) -> Result<Tree, E> {
        Ok(Tree(Value::String(value)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree(Value::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree(Value::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tree, D::Error> {
        de::DeserializeSeed::deserialize(self, deserializer)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut list = Vec::new();
        let mut index = 0;
        while let Some(Tree(item)) = seq.next_element_seed(TreeSeed(&format!("{}[{index}]", self.0)))? {
            list.push(item);
            index += 1;
        }
        Ok(Tree(Value::Array(list)))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut access: A) -> Result<Tree, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let path = join_key(self.0, &key);
            if map.contains_key(&key) {
                return Err(de::Error::custom(format!("{DUPLICATE_KEY}{path}")));
            }
            let Tree(value) = access.next_value_seed(TreeSeed(&path))?;
            map.insert(key, value);
        }
        Ok(Tree(Value::Object(map)))
    }
}

/// How a duplicate YAML key is reported; serde_yaml_ng puts its own path
/// before it, which [`yaml_syntax_error`] drops.
const DUPLICATE_KEY: &str = "duplicate key ";

fn yaml_syntax_error(text: &str, err: &serde_yaml_ng::Error) -> String {
    let mut message = err.to_string().replace('\n', "; ");
    let duplicate = message.find(DUPLICATE_KEY);
    if let Some(at) = duplicate {
        message.drain(..at);
    }
    match err.location() {
        Some(at) => {
            let (line, column) = (at.line(), at.column());
            // libyaml repeats the location in its message.
            let message = message.replacen(&format!(" at line {line} column {column}"), "", 1);
            // A duplicate is reported at the start of its mapping: point at
            // the second occurrence instead, when it can be found.
            let (line, column) = match message.strip_prefix(DUPLICATE_KEY) {
                Some(path) if duplicate.is_some() => {
                    second_occurrence(text, line, column, path).unwrap_or((line, column))
                }
                _ => (line, column),
            };
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

/// Where a key of the block mapping that starts at `line`, `column` appears
/// for the second time. The key is the end of `path` (a key may itself hold
/// dots, so every suffix is tried). `None` for flow mappings and anything
/// this plain reading of the lines cannot follow.
fn second_occurrence(text: &str, line: usize, column: usize, path: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = column.checked_sub(1)?;
    let mut suffixes: Vec<&str> = path.match_indices('.').map(|(at, _)| &path[at + 1..]).collect();
    suffixes.push(path);
    for key in suffixes {
        let forms = [format!("{key}:"), format!("\"{key}\":"), format!("'{key}':")];
        let mut seen = 0;
        for (index, text_line) in lines.iter().enumerate().skip(line.checked_sub(1)?) {
            let content = text_line.trim_start();
            let this_indent = text_line.len() - content.len();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            if this_indent < indent && index >= line {
                break;
            }
            if this_indent == indent && forms.iter().any(|form| content.starts_with(form.as_str())) {
                seen += 1;
                if seen == 2 {
                    return Some((index + 1, column));
                }
            }
        }
    }
    None
}

/// `prefix.key`, or `key` at the top level: a key as the user would name it.
pub(super) fn join_key(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests_support::*;

    #[test]
    fn the_format_is_sniffed_when_the_extension_does_not_tell() {
        let toml = load_ok("imagegc.conf", EVERY_KEY_TOML);
        let yaml = load_ok("imagegc", EVERY_KEY_YAML);
        assert_eq!(without_source(yaml), without_source(toml));
        let kubelet = load_ok(
            "config",
            &kubelet("imageGCHighThresholdPercent: 70\nimageGCLowThresholdPercent: 60\n"),
        );
        assert_eq!(kubelet.gc.high_threshold_percent, 70);
        let json = load_ok(
            "kubelet.json",
            r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "imageGCLowThresholdPercent": 60}"#,
        );
        assert_eq!(json.gc.low_threshold_percent, 60);
    }

    #[test]
    fn brackets_in_strings_and_comments_are_not_nesting() {
        let many = "[".repeat(MAX_NESTING * 2);
        let toml = format!(
            "# {many}\n[protect]\nimages = [\"{many}\", '{many}'] # {many}\na = \"\"\"\n{many}\"\"\"\"\nb = '''{many}\n'''\n"
        );
        assert!(check_cost(Format::Toml, &toml).is_ok());
        let yaml = format!("# {many}\nprotect:\n  images: [\"a\\\"{many}\", '{many}', it's]\n");
        assert!(check_cost(Format::Yaml, &yaml).is_ok());
        let nested = format!("a = {}{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
        assert!(
            check_cost(Format::Toml, &nested).is_ok(),
            "{MAX_NESTING} levels are allowed"
        );
        assert!(check_cost(Format::Toml, &format!("a = [{nested}]")).is_err());
    }

    #[test]
    fn a_stray_quote_hides_no_nesting() {
        let deep = "[".repeat(100_000);
        // YAML: a quote inside a plain value is a character.
        let yaml = format!("gc:\n  dry_run: x\"y\nprotect: {deep}");
        let refused = check_cost(Format::Yaml, &yaml).unwrap_err();
        assert!(
            refused.starts_with("line 3, column 41: more than 32 levels"),
            "{refused}"
        );
        // TOML: up to two quotes end a triple-quoted string with it, and a
        // single-line string ends at its line's end.
        for text in [
            format!("a = \"\"\"x\"\"\"\"\nb = {deep}"),
            format!("a = \"x\nb = {deep}"),
            format!("a = '''x''''\nb = {deep}"),
        ] {
            let refused = check_cost(Format::Toml, &text).unwrap_err();
            assert!(
                refused.starts_with("line 2, column 37: more than 32 levels"),
                "{refused}"
            );
        }
    }

    #[test]
    fn syntax_errors_give_line_and_column() {
        let problems = rejected("a.toml", "[gc]\ndry_run = true\nmin_age = \"2m\n");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key, "");
        assert!(
            problems[0].message.starts_with("line 3, column 14: "),
            "{}",
            problems[0]
        );
        assert!(!problems[0].message.contains('\n'));

        let problems = rejected("a.yaml", "gc:\n  dry_run: true\n   min_age: 2m\n");
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].message.starts_with("line 3, column 11: "),
            "{}",
            problems[0]
        );
        assert!(!problems[0].message.contains('\n'));
    }
}
