//! A restart: what the next process knows of the images' use.

use std::time::{Duration, SystemTime};

use imagegc_testkit::fake::FakeRuntime;

use crate::support::{
    InProcess, Settings, container_using, eventually, image, imagegc_json, load_records, parse_time, roomy_disk, secs,
};

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_restart_keeps_the_time_each_image_was_last_used() {
    let fake = FakeRuntime::new();
    let web = image("web", 1000);
    let idle = image("idle", 1000);
    fake.add_image(web.clone());
    fake.add_image(idle.clone());
    fake.add_container(container_using("c-web", &web));
    let started = SystemTime::now();
    let mut daemon = InProcess::start(fake.clone(), roomy_disk(), |_| {}, |c| c.gc.interval = secs(3600)).await;

    // The first cycle and one poll see web in use; then its container goes.
    eventually(secs(5), "the first cycle and a poll", || {
        (fake.count("ListContainers") >= 2).then_some(())
    })
    .await;
    fake.remove_container("c-web");
    let polls = fake.count("ListContainers");
    eventually(secs(5), "a poll without the container", || {
        (fake.count("ListContainers") > polls).then_some(())
    })
    .await;
    // The daemon handled the last listing with the container before it
    // asked for this one.
    let unused_since = SystemTime::now();
    daemon.stop().await;

    let records = load_records(&daemon.state_dir());
    let saved = records.get(&web.id).expect("a record for web");
    assert!(
        saved.last_used >= started && saved.last_used <= unused_since,
        "web was last used between {started:?} and {unused_since:?}, the state says {:?}",
        saved.last_used
    );

    // Later, a new process reads the same state: `imagegc plan` shows web
    // last used when its container went, not when the new process started.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let config = daemon.dir.path().join("imagegc.toml");
    Settings {
        interval: "1h",
        ..Settings::new(daemon.dir.path()).remove_everything()
    }
    .write(&config);
    let endpoint = daemon.server.as_ref().unwrap().endpoint();
    let plan = imagegc_json(&config, &endpoint, &daemon.state_dir(), &["plan"], 0).await;
    let removals = plan["removals"].as_array().expect("removals");
    let planned = |id: &str| {
        removals
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} is not planned for removal: {plan:#}"))
    };
    let last_used = parse_time(&planned(&web.id)["last_used"]);
    // The plan prints whole seconds.
    assert!(
        last_used + SECOND >= started && last_used <= unused_since,
        "plan says web was last used at {last_used:?}, expected between {started:?} and {unused_since:?}"
    );
    assert!(SystemTime::now().duration_since(last_used).unwrap() >= secs(2));
    let idle_first_seen = parse_time(&planned(&idle.id)["first_seen"]);
    assert!(
        idle_first_seen + SECOND >= started && idle_first_seen <= unused_since,
        "idle keeps the time it was first seen: {idle_first_seen:?}"
    );
    assert!(fake.removed().is_empty(), "plan removes nothing");
}
