//! The library's modules are layered: each uses only the modules src/lib.rs
//! declares before it, so the order lib.rs states cannot silently break
//! (an import circle, or a leaf that starts to lean on the engine). This
//! reads every `crate::` path of src/ outside test code and names each one
//! that reaches a module declared after its own.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The top-level modules in the order src/lib.rs declares them (test-only
/// modules left out).
fn declared_order(lib: &str) -> Vec<String> {
    let mut order = Vec::new();
    let mut test_only = false;
    for line in lib.lines().map(str::trim) {
        if line.starts_with("#[cfg(test)]") {
            test_only = true;
            continue;
        }
        if line.starts_with("#[") || line.starts_with("//") || line.is_empty() {
            continue;
        }
        let declared = line
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ")
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'));
        if let Some(name) = declared
            && !test_only
        {
            order.push(name.to_string());
        }
        test_only = false;
    }
    order
}

/// `text` without comments, nor the blocks and items under `#[cfg(test)]`
/// (a test may use any module), with the names of the files such an item
/// declares (`#[cfg(test)] mod tests;`).
fn code(text: &str) -> (String, Vec<String>) {
    let mut kept = String::new();
    let mut test_files = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let line = line.split("//").next().unwrap_or("");
        if line.trim() != "#[cfg(test)]" {
            kept.push_str(line);
            kept.push('\n');
            continue;
        }
        // Skip the item that follows: to its `;` or its closing brace.
        let mut depth = 0i32;
        let mut opened = false;
        for line in lines.by_ref() {
            let line = line.split("//").next().unwrap_or("");
            let trimmed = line.trim();
            if trimmed.starts_with("#[") {
                continue;
            }
            if let Some(name) = trimmed
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ")
                .strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'))
            {
                test_files.push(name.to_string());
                break;
            }
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
            opened |= line.contains('{');
            if (opened && depth <= 0) || (!opened && trimmed.ends_with(';')) {
                break;
            }
        }
    }
    (kept, test_files)
}

/// The top-level modules `code` names by a `crate::` path.
fn used(code: &str) -> BTreeSet<String> {
    code.match_indices("crate::")
        .filter(|(at, _)| {
            // Not `$crate::` nor the tail of another name.
            !code[..*at].ends_with(|c: char| c == '$' || c == '_' || c.is_alphanumeric())
        })
        .filter_map(|(at, _)| {
            let rest = &code[at + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// Every source file of src/ that is not test code, with its top-level
/// module.
fn sources(src: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    let mut test_files: BTreeSet<PathBuf> = BTreeSet::new();
    let mut all = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let (_, declared) = code(&std::fs::read_to_string(&path).unwrap());
                let here = if path.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs") {
                    path.parent().unwrap().to_path_buf()
                } else {
                    path.with_extension("")
                };
                for name in declared {
                    test_files.insert(here.join(format!("{name}.rs")));
                    test_files.insert(here.join(&name).join("mod.rs"));
                }
                all.push(path);
            }
        }
    }
    for path in all {
        let relative = path.strip_prefix(src).unwrap();
        let top = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let top = top.strip_suffix(".rs").unwrap_or(&top).to_string();
        if top == "lib" || top == "main" || test_files.contains(&path) {
            continue;
        }
        found.push((top, path));
    }
    found.sort();
    found
}

#[test]
fn every_module_uses_only_the_modules_lib_rs_declares_before_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let order = declared_order(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(order.len() > 10, "lib.rs's modules not found: {order:?}");
    let place = |module: &str| order.iter().position(|m| m == module);
    let mut wrong = Vec::new();
    for (module, path) in sources(&src) {
        let own = place(&module).unwrap_or_else(|| panic!("{module} is not declared in lib.rs"));
        let (code, _) = code(&std::fs::read_to_string(&path).unwrap());
        for other in used(&code) {
            match place(&other) {
                Some(at) if at > own => wrong.push(format!(
                    "{} uses crate::{other}, declared after {module}",
                    path.strip_prefix(&src).unwrap().display()
                )),
                _ => {}
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "modules out of lib.rs's order ({}):\n{}",
        order.join(" < "),
        wrong.join("\n")
    );
}

#[test]
fn the_reading_skips_comments_and_test_code_only() {
    let (kept, tests) = code(
        "use crate::a::X; // crate::b\n\
         #[cfg(test)]\nmod tests {\n    use crate::c;\n    fn f() { crate::d::g() }\n}\n\
         #[cfg(test)]\nmod support;\n\
         fn h() -> crate::e::T { $crate::f }\n",
    );
    assert_eq!(used(&kept), ["a", "e"].map(String::from).into());
    assert_eq!(tests, ["support"]);
    let order = declared_order(
        "//! crate docs\npub mod time;\npub(crate) mod fs;\n#[cfg(feature = \"k\")]\npub mod k;\n\
         #[cfg(test)]\nmod testing;\n",
    );
    assert_eq!(order, ["time", "fs", "k"]);
}
