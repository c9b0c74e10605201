//! Log output: the `--log-level` filter and the text writer.
//!
//! It owns two promises about stderr. A mistyped level (`warning`, `inf`) is
//! refused with the list of valid ones, instead of being read as the name of
//! a log target that matches nothing and silences every line. And a text log
//! line is always one line: ids, names and errors come from the runtime, so
//! every control character an event carries (a newline, an escape code) is
//! written as an escape (`\n`, `\u{1b}`) by [`EscapingStderr`], after
//! formatting, where no field or message can slip past it. JSON logs need
//! no help: serde escapes them. This module does not choose what is logged.

use std::io::{self, Write};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The levels `--log-level` takes, alone or after `target=` in a filter.
pub const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// Parses `--log-level`: a level (`warn`), or comma-separated directives
/// each ending in a level (`info,imagegc=debug`). Anything else, such as
/// `warning` or `debg`, is an error naming the valid levels.
pub fn filter(text: &str) -> Result<EnvFilter, String> {
    let directives: Vec<&str> = text.split(',').map(str::trim).collect();
    for &directive in &directives {
        // `target=level`, `target[span]=level` or a bare level.
        let level = directive.rsplit_once('=').map_or(directive, |(_, level)| level);
        if !LEVELS.iter().any(|known| known.eq_ignore_ascii_case(level.trim())) {
            return Err(format!(
                "unknown level {directive:?} in {text:?}; expected one of {} (or target=level directives such \
                 as \"info,imagegc=debug\")",
                LEVELS.join(", ")
            ));
        }
    }
    EnvFilter::try_new(directives.join(",")).map_err(|err| format!("{text:?}: {err}"))
}

/// Standard error for the text log, with every control character of an
/// event escaped except the newline that ends it.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapingStderr;

impl<'a> MakeWriter<'a> for EscapingStderr {
    type Writer = Escaping<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        Escaping(io::stderr())
    }
}

/// A writer that escapes control characters in what it is given. The fmt
/// layer hands it one whole event per write, so a newline is kept only as
/// the last byte of a write.
#[derive(Debug)]
pub struct Escaping<W>(pub W);

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(&escape_line(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// `buf` with its control characters escaped, its final newline kept.
/// Bytes that are not UTF-8 are escaped as `\x..`.
pub fn escape_line(buf: &[u8]) -> Vec<u8> {
    let (body, newline) = match buf.strip_suffix(b"\n") {
        Some(body) => (body, true),
        None => (buf, false),
    };
    let needs_escaping = body.iter().any(|&b| b < 0x20 || b == 0x7f || b >= 0x80);
    if !needs_escaping {
        return buf.to_vec();
    }
    let mut out = String::with_capacity(body.len() + 16);
    for chunk in body.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                out.extend(c.escape_debug());
            } else {
                out.push(c);
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    if newline {
        out.push('\n');
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mistyped_levels_are_refused_naming_the_valid_ones() {
        for level in ["warning", "inf", "debg", "info,imagegc=verbose", "imagegc"] {
            let err = filter(level).unwrap_err();
            assert!(
                err.contains("expected one of error, warn, info, debug, trace, off"),
                "{level}: {err}"
            );
        }
    }

    #[test]
    fn levels_and_target_directives_are_accepted() {
        for level in ["warn", "INFO", "off", "info,imagegc=debug", "h2=warn, imagegc=trace"] {
            assert!(filter(level).is_ok(), "{level}");
        }
    }

    #[test]
    fn a_newline_inside_an_event_cannot_start_a_second_line() {
        let line = "INFO removed image image=sha256:1\n2030-01-01 ERROR forged\u{1b}[2J\u{9b}1m\n";
        let escaped = String::from_utf8(escape_line(line.as_bytes())).unwrap();
        assert_eq!(
            escaped,
            "INFO removed image image=sha256:1\\n2030-01-01 ERROR forged\\u{1b}[2J\\u{9b}1m\n"
        );
    }

    #[test]
    fn a_plain_line_is_written_unchanged() {
        let line = "INFO connected to the container runtime endpoint=unix:///run/é.sock\n";
        assert_eq!(escape_line(line.as_bytes()), line.as_bytes());
    }

    #[test]
    fn bytes_that_are_not_utf8_are_escaped() {
        assert_eq!(escape_line(b"id=\xff\xfe\n"), b"id=\\xff\\xfe\n");
    }
}
