//! `imagegc check-config` on malformed configuration files: each one exits
//! with status 2, prints nothing on stdout, and reports on stderr a line
//! naming the file and the key, without panicking. `config::load` on the
//! same files gives exactly that one problem.

#[path = "config_errors/cases.rs"]
mod cases;

use std::process::Command;
use std::time::{Duration, Instant};

use imagegc::config::{self, Overrides};

#[test]
fn check_config_names_the_file_and_the_key_of_every_malformed_file() {
    let dir = tempfile::tempdir().unwrap();
    assert!(cases::CASES.len() >= 30);
    let mut failures = Vec::new();
    for case in cases::CASES {
        let path = case.create_in(dir.path());
        let output = Command::new(env!("CARGO_BIN_EXE_imagegc"))
            .arg("check-config")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let expected = case.expected_line_start(&path);

        let mut wrong = Vec::new();
        if output.status.code() != Some(2) {
            wrong.push(format!("exit status {:?}, expected 2", output.status.code()));
        }
        if !stdout.is_empty() {
            wrong.push("stdout is not empty".to_owned());
        }
        if !stderr.lines().any(|line| line.starts_with(&expected)) {
            wrong.push(format!("no stderr line starts with {expected:?}"));
        }
        if stderr.contains("panicked") || stderr.contains("stack backtrace") {
            wrong.push("it panicked".to_owned());
        }
        if !wrong.is_empty() {
            failures.push(format!(
                "{}: {}\n--- stdout\n{stdout}--- stderr\n{stderr}",
                case.name,
                wrong.join("; ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases::CASES.len(),
        failures.join("\n")
    );
}

#[test]
fn a_mistyped_log_level_exits_2_listing_the_valid_levels() {
    for level in ["warning", "inf", "debg"] {
        let output = Command::new(env!("CARGO_BIN_EXE_imagegc"))
            .env_remove("IMAGEGC_CONFIG")
            .args(["--log-level", level, "check-config"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "--log-level {level}: {stderr}");
        assert!(output.stdout.is_empty(), "--log-level {level} ran the command");
        assert!(
            stderr.starts_with("imagegc: --log-level: ")
                && stderr.contains(&format!("{level:?}"))
                && stderr.contains("expected one of error, warn, info, debug, trace, off"),
            "--log-level {level}: {stderr}"
        );
    }
}

#[test]
fn every_malformed_file_names_its_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    assert!(cases::CASES.len() >= 30);
    let mut failures = Vec::new();
    for case in cases::CASES {
        let path = case.create_in(dir.path());
        let expected = case.expected_line_start(&path);
        match config::load(Some(&path), &Overrides::default()) {
            Ok(_) => failures.push(format!("{}: loaded without problems", case.name)),
            Err(err) => {
                let lines: Vec<String> = err.problems.iter().map(ToString::to_string).collect();
                let named = lines.len() == 1 && lines[0].starts_with(&expected);
                if !named || err.problems[0].file != path.display().to_string() {
                    failures.push(format!(
                        "{}: expected one line starting {expected:?}, got {lines:#?}",
                        case.name
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_mebibyte_of_brackets_behind_a_stray_quote_is_refused_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "yaml-stray-quote-then-a-mebibyte-of-brackets",
        "yaml-stray-quote-then-a-mebibyte-of-dashes",
        "toml-string-ending-in-four-quotes-then-brackets",
    ] {
        let case = cases::CASES.iter().find(|case| case.name == name).unwrap();
        let path = case.create_in(dir.path());
        let started = Instant::now();
        let err = config::load(Some(&path), &Overrides::default()).expect_err(name);
        let took = started.elapsed();
        let problem = err.problems[0].to_string();
        assert!(problem.starts_with(&case.expected_line_start(&path)), "{problem}");
        assert!(took < Duration::from_secs(1), "{name} took {took:?} to refuse");
    }
}

#[test]
fn error_case_names_are_unique() {
    let mut names: Vec<_> = cases::CASES.iter().map(|case| case.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases::CASES.len());
}

/// `[kubernetes]` on without what it needs: `run` and `once` stop at start
/// with status 2, naming the key, before they call the runtime.
#[cfg(feature = "kubernetes")]
#[test]
fn kubernetes_without_a_node_name_or_credentials_stops_at_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("k.toml");
    std::fs::write(&file, "[kubernetes]\nenabled = true\n").unwrap();
    let state = dir.path().join("state");
    let start = |command: &str, node: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_imagegc"));
        cmd.arg(command)
            .arg("--config")
            .arg(&file)
            .arg("--state-dir")
            .arg(&state)
            .args(["--runtime-endpoint", "unix:///nonexistent/imagegc-test.sock"])
            .env_remove("NODE_NAME")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env_remove("KUBECONFIG");
        if let Some(node) = node {
            cmd.env("NODE_NAME", node);
        }
        cmd.output().unwrap()
    };
    let expected = |key: &str| format!("{}: kubernetes.{key}: ", file.display());
    for command in ["run", "once"] {
        let output = start(command, None);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains(&expected("node_name")), "{command}: {stderr}");
        let output = start(command, Some("node-1"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains(&expected("kubeconfig")), "{command}: {stderr}");
    }
}

/// `imagegc --version` names the release and the commit the binary was
/// built from, so that two builds of one version can be told apart.
#[test]
fn the_version_names_the_commit_built() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_imagegc"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(output.status.success());
    let said = String::from_utf8_lossy(&output.stdout);
    let prefix = format!("imagegc {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(said.starts_with(&prefix), "{said}");
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|h| h.status.success());
    if let Some(head) = head {
        let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
        assert!(said[prefix.len()..].starts_with(&head), "{said} is not of {head}");
    }
}
