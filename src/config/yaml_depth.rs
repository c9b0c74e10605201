//! How deep a YAML text nests, as the parser that reads it sees it: libyaml,
//! which serde_yaml_ng runs, read one event at a time and left at the first
//! collection deeper than the limit.
//!
//! A scan of the text for `[` and `{` cannot tell, without parsing YAML,
//! whether a quote opens a string (`"a"`) or is a character of a plain
//! value (`a"b`), and so a stray quote can hide a mebibyte of brackets from
//! it. The parser's own events cannot be fooled. libyaml looks ahead at most
//! 1024 characters for a key, so stopping at the limit costs the lines
//! before it, not the file: parsing a whole file spends time quadratic in
//! its depth. This module reads text and nothing else.

use std::mem::MaybeUninit;

/// Where the first collection (mapping or sequence, flow or block) deeper
/// than `limit` starts, as a 1-based line and column; `None` when there is
/// none. Documents are all read; the top-level collection is the first
/// level. Text libyaml cannot parse is `None` up to its error: the full
/// parse that follows reports it, having read nothing deeper than `limit`.
pub(super) fn too_deep(text: &str, limit: usize) -> Option<(usize, usize)> {
    let mut storage = Box::new(MaybeUninit::<unsafe_libyaml::yaml_parser_t>::uninit());
    let parser = storage.as_mut_ptr();
    // SAFETY: the parser is initialized before use and deleted once, on every
    // path after a successful initialization; it is boxed, so it does not move
    // while it points at itself, and `text` outlives it. Each event is
    // initialized by a successful `yaml_parser_parse` and deleted right after
    // its type and mark are copied out.
    unsafe {
        if unsafe_libyaml::yaml_parser_initialize(parser).fail {
            return None;
        }
        unsafe_libyaml::yaml_parser_set_encoding(parser, unsafe_libyaml::YAML_UTF8_ENCODING);
        unsafe_libyaml::yaml_parser_set_input_string(parser, text.as_ptr(), text.len() as u64);
        let mut depth = 0usize;
        let found = loop {
            let mut event = MaybeUninit::<unsafe_libyaml::yaml_event_t>::uninit();
            if unsafe_libyaml::yaml_parser_parse(parser, event.as_mut_ptr()).fail {
                break None;
            }
            let event = event.as_mut_ptr();
            let (kind, mark) = ((*event).type_, (*event).start_mark);
            unsafe_libyaml::yaml_event_delete(event);
            match kind {
                unsafe_libyaml::YAML_SEQUENCE_START_EVENT | unsafe_libyaml::YAML_MAPPING_START_EVENT => {
                    depth += 1;
                    if depth > limit {
                        break Some((mark.line as usize + 1, mark.column as usize + 1));
                    }
                }
                unsafe_libyaml::YAML_SEQUENCE_END_EVENT | unsafe_libyaml::YAML_MAPPING_END_EVENT => {
                    depth = depth.saturating_sub(1);
                }
                unsafe_libyaml::YAML_STREAM_END_EVENT => break None,
                _ => {}
            }
        };
        unsafe_libyaml::yaml_parser_delete(parser);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_in_plain_values_hide_no_nesting() {
        let deep = format!("a: x\"y\nb: {}", "[".repeat(100_000));
        assert_eq!(too_deep(&deep, 32), Some((2, 35)));
        let deep = format!("a: [\"x\n\", {}]", "[".repeat(100_000));
        assert_eq!(too_deep(&deep, 32), Some((2, 34)));
    }

    #[test]
    fn brackets_in_strings_comments_and_block_text_are_not_nesting() {
        let many = "[".repeat(100);
        let text = format!("# {many}\na: \"{many}\"\nb: '{many}'\nc: x{many}\nd: |\n  {many}\n");
        assert_eq!(too_deep(&text, 2), None);
    }

    #[test]
    fn block_and_flow_collections_count_alike() {
        assert_eq!(too_deep("a:\n  b:\n    c: [1]\n", 4), None);
        assert_eq!(too_deep("a:\n  b:\n    c: [1]\n", 3), Some((3, 8)));
        assert_eq!(too_deep("a:\n  b:\n    c: [1]\n", 2), Some((3, 5)));
        assert_eq!(too_deep(&"- ".repeat(100_000), 32), Some((1, 65)));
        assert_eq!(too_deep("{}\n---\n[[[]]]\n", 2), Some((3, 3)));
    }

    #[test]
    fn text_libyaml_cannot_parse_is_left_to_the_parser() {
        assert_eq!(too_deep("a: [\n", 32), None);
        assert_eq!(too_deep("\t- a", 32), None);
    }
}
