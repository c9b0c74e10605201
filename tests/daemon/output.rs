//! What the runtime says, printed and logged: cut short, escaped, warned
//! about once; and the times `plan --output json` gives.

use std::time::SystemTime;

use imagegc_testkit::fake::{Dialect, FakeRuntime};

use crate::support::{self, Daemon, Settings, eventually, image, imagegc_json, parse_time, secs};

/// An image whose tag is 70,000 characters long, as a runtime may report.
fn image_with_a_huge_tag(name: &str) -> imagegc::cri::Image {
    let mut huge = image(name, 1000);
    huge.repo_tags = vec![format!("registry.test/{name}:{}", "x".repeat(70_000))].into();
    huge
}

#[tokio::test]
async fn a_tag_of_70000_characters_is_cut_short_in_every_table() {
    let fake = FakeRuntime::new();
    let huge = image_with_a_huge_tag("huge");
    fake.add_image(huge.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings::new(dir.path()).remove_everything().write(&config);

    // `once` removes the image (and exits 3: low 0 is never reached), so
    // that `history` has the huge tag to show too.
    for (args, code) in [
        (&["images"][..], 0),
        (&["plan"][..], 0),
        (&["once"][..], 3),
        (&["history"][..], 0),
    ] {
        let output = support::imagegc_command(&config, &server.endpoint(), &state, args).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "imagegc {args:?}:\n{stderr}");
        assert!(
            stdout.contains("registry.test/huge:xxxxxxxx"),
            "imagegc {args:?} shows the start of the tag:\n{stdout}"
        );
        assert!(
            stdout.lines().all(|line| line.chars().count() < 1000),
            "imagegc {args:?} printed the whole tag"
        );
    }
    assert_eq!(fake.removed(), vec![huge.id.clone()]);
}

#[tokio::test]
async fn escape_codes_in_a_tag_are_printed_escaped_in_tables() {
    let fake = FakeRuntime::new();
    let mut forged = image("forged", 1000);
    forged.repo_tags = vec!["registry.test/forged:1\u{1b}[2J\nsha256:000000000000  fake-row".to_string()].into();
    fake.add_image(forged);
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).write(&config);

    let output = support::imagegc_command(&config, &server.endpoint(), &dir.path().join("state"), &["images"]).await;

    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        !stdout.contains('\u{1b}'),
        "an escape code reached the terminal:\n{stdout}"
    );
    assert!(
        !stdout.lines().any(|line| line.starts_with("sha256:000000000000")),
        "the tag forged a row:\n{stdout}"
    );
    assert!(stdout.contains(r"registry.test/forged:1\u{1b}[2J\nsha256"), "{stdout}");
}

#[tokio::test]
async fn newlines_and_escape_codes_from_the_runtime_cannot_forge_log_lines() {
    let fake = FakeRuntime::new();
    let mut forged = image("forged", 1000);
    forged.id = format!("{}\n2030-01-01T00:00:00Z ERROR forged line\u{1b}[2J", forged.id);
    forged.repo_tags = vec!["registry.test/forged:1\nINFO forged tag line".to_string()].into();
    fake.add_image(forged.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).remove_everything().write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);

    daemon.wait_logged("removed image", secs(10)).await;
    daemon.signal(libc::SIGTERM);
    assert!(daemon.exited_within(secs(10)).await.is_some());

    let log = daemon.stderr();
    assert!(!log.contains('\u{1b}'), "an escape code reached the log:\n{log}");
    for line in log.lines() {
        assert!(
            !line.starts_with("2030-01-01") && !line.starts_with("INFO forged"),
            "a forged line in the log:\n{log}"
        );
    }
    assert!(
        log.contains(r"\n2030-01-01T00:00:00Z ERROR forged line\u{1b}[2J"),
        "{log}"
    );
}

/// CRI-O 1.26 with no pod running names its sandbox image nowhere and pins
/// nothing: the operator is told once, at start, to set
/// `runtime.sandbox_image`, not once per cycle, and meanwhile nothing that
/// no container ever used is removed.
#[tokio::test]
async fn an_unnamed_sandbox_image_is_warned_about_once_naming_runtime_sandbox_image() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio126);
    fake.set_sandbox_image(None);
    fake.add_image(image("pause", 1000));
    fake.add_image(image("fresh", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).remove_everything().write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);

    eventually(secs(10), "three cycles", || {
        (fake.count("ListImages") >= 3).then_some(())
    })
    .await;
    daemon.signal(libc::SIGTERM);
    assert!(daemon.exited_within(secs(10)).await.is_some());

    let log = daemon.stderr();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("set runtime.sandbox_image"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning in three cycles:\n{log}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(
        fake.removed().is_empty(),
        "never-used images are kept: {:?}",
        fake.removed()
    );
}

#[tokio::test]
async fn a_runtime_that_refuses_the_listing_is_logged_with_its_own_error() {
    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    fake.fail_always(
        "ListImages",
        Some(tonic::Status::permission_denied("denied by the node's security policy")),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);

    daemon.wait_logged("container runtime refused", secs(10)).await;

    let log = daemon.stderr();
    let warning = log
        .lines()
        .find(|line| line.contains("container runtime refused"))
        .unwrap();
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("denied by the node's security policy"), "{warning}");
    assert_eq!(daemon.logged("not reachable"), 0, "{log}");
}

#[tokio::test]
async fn plan_json_gives_when_a_young_image_becomes_removable_as_a_time() {
    let fake = FakeRuntime::new();
    fake.add_image(image("young", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings {
        min_age: "1h",
        max_age: "2h",
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let before = SystemTime::now();

    let plan = imagegc_json(&config, &server.endpoint(), &dir.path().join("state"), &["plan"], 0).await;

    let kept = &plan["kept"][0];
    assert_eq!(kept["reason"], "too_young", "{plan:#}");
    let removable_after = parse_time(&kept["removable_after"]);
    assert!(
        removable_after > before + secs(3500) && removable_after < SystemTime::now() + secs(3700),
        "{plan:#}"
    );
}

#[tokio::test]
async fn plan_asks_only_about_containers_the_daemon_has_not_seen() {
    let fake = FakeRuntime::new();
    for n in 0..20 {
        let used = image(&format!("app{n}"), 1000);
        fake.add_image(used.clone());
        fake.add_container(imagegc_testkit::container_using(&format!("c{n}"), &used));
    }
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings::new(dir.path()).write(&config);
    let statuses = || fake.calls().iter().filter(|c| *c == "ContainerStatus").count();

    // Nothing learnt yet: plan asks about every container.
    imagegc_json(&config, &server.endpoint(), &state, &["plan"], 0).await;
    assert_eq!(statuses(), 20);
    // A cycle learns them and notes them in the state directory.
    imagegc_json(&config, &server.endpoint(), &state, &["once"], 0).await;
    assert_eq!(statuses(), 40);
    // plan now asks only about the container created since.
    let new = image("fresh", 1000);
    fake.add_image(new.clone());
    fake.add_container(imagegc_testkit::container_using("c-new", &new));
    let plan = imagegc_json(&config, &server.endpoint(), &state, &["plan"], 0).await;
    assert_eq!(statuses(), 41, "{plan:#}");
    // And still sees every container's image as in use.
    let in_use = plan["kept"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["reason"] == "in_use")
        .count();
    assert_eq!(in_use, 21, "{plan:#}");
}

#[tokio::test]
async fn plan_names_its_order_and_with_reuse_when_each_image_is_expected_back() {
    let fake = FakeRuntime::new();
    fake.add_image(image("a", 1000));
    fake.add_image(image("b", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings::new(dir.path()).remove_everything().write(&config);
    let toml = std::fs::read_to_string(&config).unwrap();

    let output = support::imagegc_command(&config, &server.endpoint(), &state, &["plan"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("gc.order = \"reuse\""), "the default: {stdout}");
    assert!(stdout.contains("EXPECTED BACK"), "{stdout}");

    std::fs::write(&config, toml.replace("[gc]\n", "[gc]\norder = \"superseded-first\"\n")).unwrap();
    let output = support::imagegc_command(&config, &server.endpoint(), &state, &["plan"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("gc.order = \"superseded-first\""), "{stdout}");
    assert!(!stdout.contains("EXPECTED BACK"), "{stdout}");

    std::fs::write(&config, toml.replace("[gc]\n", "[gc]\norder = \"reuse\"\n")).unwrap();
    let output = support::imagegc_command(&config, &server.endpoint(), &state, &["plan"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("gc.order = \"reuse\""), "{stdout}");
    assert!(stdout.contains("EXPECTED BACK"), "{stdout}");
    let plan = imagegc_json(&config, &server.endpoint(), &state, &["plan"], 0).await;
    assert_eq!(plan["order"], "reuse", "{plan:#}");
    let removals = plan["removals"].as_array().unwrap();
    assert_eq!(removals.len(), 2, "{plan:#}");
    for removal in removals {
        // Never used: as long from now as it has been unused, so now.
        parse_time(&removal["expected_back"]);
        assert_eq!(removal["expected_back_by"], "unused", "{plan:#}");
    }
    assert!(stdout.contains("(unused "), "what the expectation went by: {stdout}");

    // `auto`: the prior order until the daemon judged, then the one it chose
    // (order.json in the state directory), and why.
    std::fs::write(&config, toml.replace("[gc]\n", "[gc]\norder = \"auto\"\n")).unwrap();
    let plan = imagegc_json(&config, &server.endpoint(), &state, &["plan"], 0).await;
    assert_eq!(plan["order"], "reuse", "{plan:#}");
    assert!(
        plan["order_chosen"]
            .as_str()
            .unwrap()
            .contains("until the daemon has judged"),
        "{plan:#}"
    );
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&state)
        .unwrap();
    std::fs::write(
        state.join("order.json"),
        r#"{"at":1800000000,"order":"lru","figures":[{"order":"lru","repulled_bytes":1000,"hours_above_high":0.0},{"order":"superseded-first","repulled_bytes":5000,"hours_above_high":0.0},{"order":"reuse","repulled_bytes":2000,"hours_above_high":0.0}],"window_secs":604800,"sampled":1.0}"#,
    )
    .unwrap();
    let plan = imagegc_json(&config, &server.endpoint(), &state, &["plan"], 0).await;
    assert_eq!(plan["order"], "lru", "{plan:#}");
    assert_eq!(
        plan["order_chosen"],
        "auto: lru: 1000 B pulled again over the last 7d, against 4.9 KiB for superseded-first and 2.0 KiB for reuse",
        "{plan:#}"
    );
    assert!(
        plan["removals"][0].get("expected_back").is_none(),
        "lru goes by no expectation: {plan:#}"
    );
    let output = support::imagegc_command(&config, &server.endpoint(), &state, &["plan"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("in the order gc.order = \"auto\" chose, lru"),
        "{stdout}"
    );
    assert!(!stdout.contains("EXPECTED BACK"), "{stdout}");
}
