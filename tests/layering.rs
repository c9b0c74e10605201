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
    // The directories of test modules (`engine/tests/`): every file under
    // one is test code too.
    let mut test_dirs: BTreeSet<PathBuf> = BTreeSet::new();
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
                    test_dirs.insert(here.join(&name));
                }
                all.push(path);
            }
        }
    }
    for path in all {
        let relative = path.strip_prefix(src).unwrap();
        let top = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let top = top.strip_suffix(".rs").unwrap_or(&top).to_string();
        if top == "lib" || top == "main" || test_files.contains(&path) || test_dirs.iter().any(|d| path.starts_with(d))
        {
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

#[test]
fn a_test_modules_files_are_test_code_however_deep() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |path: &str, text: &str| {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "pub mod a;\n");
    write("a/mod.rs", "mod b;\n#[cfg(test)]\nmod tests;\n");
    write("a/b.rs", "");
    write("a/tests/mod.rs", "mod topic;\n");
    write("a/tests/topic.rs", "use crate::later::X;\n");
    write("a/tests/deeper/more.rs", "");
    let found: Vec<PathBuf> = sources(src)
        .into_iter()
        .map(|(_, path)| path.strip_prefix(src).unwrap().to_path_buf())
        .collect();
    assert_eq!(found, [PathBuf::from("a/b.rs"), PathBuf::from("a/mod.rs")]);
}

/// The module path of a source file of src/ (`src/policy/order/reuse.rs`:
/// `policy::order::reuse`; `src/policy/mod.rs`: `policy`).
fn module_path(src: &Path, path: &Path) -> Vec<String> {
    let mut segments: Vec<String> = path
        .strip_prefix(src)
        .unwrap()
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if segments.last().is_some_and(|s| s == "mod") {
        segments.pop();
    }
    segments
}

/// Every module path `code`, the code of module `here`, names by a
/// `crate::`, `super::` or `self::` path, with each name of a braced group
/// (`use super::{a::X, b}`) taken as its own path.
fn paths_used(code: &str, here: &[String]) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let word = |c: u8| c == b'_' || c.is_ascii_alphanumeric();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            if at > 0 && (word(bytes[at - 1]) || bytes[at - 1] == b'$' || bytes[at - 1] == b':') {
                continue;
            }
            // The path: names and `::`, and a braced group at its end.
            let rest = &code[at..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            let mut segments: Vec<&str> = rest[..end].split("::").filter(|s| !s.is_empty()).collect();
            let mut base: Vec<String> = Vec::new();
            match segments.first() {
                Some(&"crate") => {
                    segments.remove(0);
                }
                _ => {
                    base = here.to_vec();
                    while let Some(&first) = segments.first() {
                        match first {
                            "super" => {
                                base.pop();
                            }
                            "self" => {}
                            _ => break,
                        }
                        segments.remove(0);
                    }
                }
            }
            let prefix: Vec<String> = base
                .into_iter()
                .chain(segments.iter().map(ToString::to_string))
                .collect();
            if let Some(group) = rest[end..].strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let first = item.trim().split("::").next().unwrap_or("").trim();
                    if !first.is_empty() && first != "self" {
                        found.insert(prefix.iter().cloned().chain([first.to_string()]).collect());
                    }
                }
            }
            found.insert(prefix);
        }
    }
    found
}

/// Circles between the files (and subdirectories) of one module: for each
/// module, which of its children uses which, and the circles among them.
/// A child using its module's own items (`super::Collector`, what mod.rs
/// declares) is no edge: mod.rs declares the children.
fn circles(src: &Path) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet as Set};
    let files: Vec<(Vec<String>, PathBuf)> = sources(src)
        .into_iter()
        .map(|(_, path)| (module_path(src, &path), path))
        .collect();
    let modules: Set<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<Vec<String>, Set<(String, String)>> = BTreeMap::new();
    for (module, path) in &files {
        let (code, _) = code(&std::fs::read_to_string(path).unwrap());
        for used in paths_used(&code, module) {
            let common = module.iter().zip(&used).take_while(|(a, b)| a == b).count();
            // Top-level modules are the other test's.
            if common == 0 || module.len() <= common || used.len() <= common {
                continue;
            }
            let parent = module[..common].to_vec();
            let (from, to) = (module[common].clone(), used[common].clone());
            let mut child = parent.clone();
            child.push(to.clone());
            if modules.contains(&child) {
                edges.entry(parent).or_default().insert((from, to));
            }
        }
    }
    let mut found = Vec::new();
    for (parent, pairs) in &edges {
        // A circle: a child that reaches itself again.
        let next = |from: &str| -> Vec<String> {
            pairs
                .iter()
                .filter(|(a, _)| a == from)
                .map(|(_, b)| b.clone())
                .collect()
        };
        let children: Set<&String> = pairs.iter().map(|(a, _)| a).collect();
        for start in children {
            let mut stack = vec![(start.clone(), vec![start.clone()])];
            let mut seen: Set<String> = Set::new();
            while let Some((at, trail)) = stack.pop() {
                for to in next(&at) {
                    if &to == start {
                        // Each circle once: from its smallest name.
                        if trail.iter().all(|t| t >= start) {
                            found.push(format!("{}: {} -> {start}", parent.join("::"), trail.join(" -> ")));
                        }
                    } else if seen.insert(to.clone()) {
                        let mut longer = trail.clone();
                        longer.push(to.clone());
                        stack.push((to, longer));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn no_two_files_of_a_module_use_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = circles(&src);
    assert!(found.is_empty(), "circles between files of one module:\n{found:#?}");
}

#[test]
fn a_circle_between_two_files_of_a_module_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("m")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod m;\n").unwrap();
    std::fs::write(src.join("m/mod.rs"), "mod a;\nmod b;\nmod c;\npub struct Top;\n").unwrap();
    std::fs::write(src.join("m/a.rs"), "use super::b::B;\nuse super::Top;\npub struct A;\n").unwrap();
    std::fs::write(src.join("m/b.rs"), "use crate::m::{c::C, Top};\npub struct B;\n").unwrap();
    std::fs::write(
        src.join("m/c.rs"),
        "pub struct C;\nfn f() -> super::a::A { todo!() }\n#[cfg(test)]\nmod tests { use super::super::b::B; }\n",
    )
    .unwrap();
    assert_eq!(circles(src), ["m: a -> b -> c -> a"]);
    // Without the use from c (its test's does not count), no circle.
    std::fs::write(src.join("m/c.rs"), "pub struct C;\n").unwrap();
    assert!(circles(src).is_empty());
}
