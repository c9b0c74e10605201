//! The seeded driver: containers come and go, images are imported again, and races strike into the daemon's walk.

use super::*;

/// One image the driver plays with, and its layout tarball, written once
/// and imported again whenever the driver pulls the image.
pub(crate) struct ChaosImage {
    pub(crate) built: BuiltImage,
    pub(crate) tarball: PathBuf,
}

/// A container's life as the driver lived it, in wall-clock times.
#[derive(Debug, Clone)]
pub(crate) struct Life {
    pub(crate) id: ContainerId,
    pub(crate) image: usize,
    pub(crate) create_sent: SystemTime,
    pub(crate) create_done: SystemTime,
    /// When StartContainer returned.
    pub(crate) start_done: Option<SystemTime>,
    pub(crate) stop_sent: Option<SystemTime>,
    pub(crate) remove_sent: Option<SystemTime>,
}

impl Life {
    pub(crate) fn is_live(&self) -> bool {
        self.remove_sent.is_none()
    }

    pub(crate) fn is_running(&self) -> bool {
        self.start_done.is_some() && self.stop_sent.is_none()
    }

    /// Visible to a re-check sent at `check` and not yet being removed when
    /// the removal began at `removal`.
    pub(crate) fn seen_through(&self, check: SystemTime, removal: SystemTime) -> bool {
        self.create_done < check && self.remove_sent.is_none_or(|t| t > removal)
    }

    pub(crate) fn running_at(&self, t: SystemTime) -> bool {
        self.start_done.is_some_and(|s| s < t) && self.stop_sent.is_none_or(|s| s > t)
    }

    /// Created across a re-check: sent before the removal ended (`done`;
    /// None when the daemon stopped before logging it), returned after the
    /// re-check was sent, and not removed before that re-check.
    pub(crate) fn created_across(&self, check: SystemTime, done: Option<SystemTime>) -> bool {
        done.is_none_or(|d| self.create_sent < d)
            && self.create_done >= check
            && self.remove_sent.is_none_or(|t| t > check)
    }

    /// Created after the re-check answered (later than any round trip
    /// explains) and before the removal began, and not yet being removed
    /// then: the removal relied on a stale re-check.
    pub(crate) fn created_after_answer(&self, check: SystemTime, removal: SystemTime) -> bool {
        self.create_done > check + RECHECK_ROUND_TRIP
            && self.create_done < removal
            && self.remove_sent.is_none_or(|t| t > removal)
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Create,
    PullAndRun,
    Pull,
    Race,
    LateRace,
    Start,
    Stop,
    Remove,
}

/// The random driver and what it recorded.
pub(crate) struct Driver<'a> {
    pub(crate) bed: &'a TestBed,
    pub(crate) images: Vec<ChaosImage>,
    pub(crate) pods: Vec<PodId>,
    pub(crate) rng: XorShift,
    pub(crate) lives: Vec<Life>,
    pub(crate) ops: BTreeMap<&'static str, u64>,
    /// CreateContainer and StartContainer calls the runtime refused, and
    /// imports that failed, with why: the daemon removed the image under
    /// them.
    pub(crate) refusals: Vec<String>,
    /// Where the images' tarballs are, and bundles of them are written.
    pub(crate) tarballs: PathBuf,
    pub(crate) log: LogTail,
    pub(crate) t0: SystemTime,
}

impl Driver<'_> {
    pub(crate) async fn run(&mut self, duration: Duration) {
        let deadline = Instant::now() + duration;
        while Instant::now() < deadline {
            self.step().await;
            let pause = self.rng.between(PAUSE_MS.0, PAUSE_MS.1);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// One operation, drawn with weights among those the state allows.
    pub(crate) async fn step(&mut self) {
        let present = self.bed.list_image_ids().await;
        let live: Vec<usize> = (0..self.lives.len()).filter(|&i| self.lives[i].is_live()).collect();
        let created: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&i| self.lives[i].start_done.is_none() && self.lives[i].stop_sent.is_none())
            .collect();
        let running: Vec<usize> = live.iter().copied().filter(|&i| self.lives[i].is_running()).collect();
        let available: Vec<usize> = (0..self.images.len())
            .filter(|&i| present.contains(&self.images[i].built.id))
            .collect();
        let missing: Vec<usize> = (0..self.images.len()).filter(|i| !available.contains(i)).collect();
        let room = live.len() < MAX_CONTAINERS;
        let choices = [
            (Op::Create, if room && !available.is_empty() { 25 } else { 0 }),
            (Op::PullAndRun, if room && !missing.is_empty() { 15 } else { 0 }),
            (Op::Pull, if missing.is_empty() { 0 } else { 10 }),
            (Op::Race, if room && missing.len() >= 2 { 25 } else { 0 }),
            (Op::LateRace, if room && missing.len() >= 2 { 15 } else { 0 }),
            (Op::Start, if created.is_empty() { 0 } else { 8 }),
            (Op::Stop, if running.is_empty() { 0 } else { 15 }),
            (Op::Remove, if live.is_empty() { 0 } else { 25 }),
        ];
        let total: u64 = choices.iter().map(|(_, w)| w).sum();
        if total == 0 {
            return;
        }
        let mut roll = self.rng.below(total);
        let op = choices
            .iter()
            .find(|(_, weight)| {
                let hit = roll < *weight;
                roll = roll.saturating_sub(*weight);
                hit
            })
            .map(|(op, _)| *op)
            .expect("the roll is below the total weight");
        match op {
            Op::Create => {
                // Prefer an image no container uses: the daemon is about to
                // remove exactly those.
                let used: BTreeSet<usize> = live.iter().map(|&i| self.lives[i].image).collect();
                let unused: Vec<usize> = available.iter().copied().filter(|i| !used.contains(i)).collect();
                let pool = if !unused.is_empty() && self.rng.chance(70) {
                    unused
                } else {
                    available
                };
                let image = *self.rng.pick(&pool).expect("a present image");
                let start = self.rng.chance(50);
                self.create(image, start, "create").await;
            }
            Op::PullAndRun => {
                let image = *self.rng.pick(&missing).expect("a missing image");
                self.pull_and_run(image).await;
            }
            Op::Pull => {
                let images = self.draw(&missing, PULL_IMAGES);
                self.import(&images).await;
            }
            Op::Race => {
                let images = self.draw(&missing, RACE_IMAGES);
                self.race(&images).await;
            }
            Op::LateRace => {
                let images = self.draw(&missing, RACE_IMAGES);
                self.late_race(&images).await;
            }
            Op::Start => {
                let i = *self.rng.pick(&created).expect("a created container");
                self.start(i).await;
            }
            Op::Stop => {
                let i = *self.rng.pick(&running).expect("a running container");
                self.stop(i).await;
            }
            Op::Remove => {
                let i = *self.rng.pick(&live).expect("a container");
                self.remove(i).await;
            }
        }
    }

    pub(crate) fn count(&mut self, op: &'static str) {
        *self.ops.entry(op).or_default() += 1;
    }

    /// Distinct images drawn from `pool` (not empty): between `range.0`
    /// and `range.1`, and no more than the pool has.
    pub(crate) fn draw(&mut self, pool: &[usize], range: (u64, u64)) -> Vec<usize> {
        let mut pool = pool.to_vec();
        let mut drawn = Vec::new();
        for _ in 0..self.rng.between(range.0, range.1).min(pool.len() as u64) {
            let i = self.rng.below(pool.len() as u64) as usize;
            drawn.push(pool.swap_remove(i));
        }
        drawn
    }

    /// Imports `images` in one go (one `ctr` run on containerd, pushes and
    /// pulls on CRI-O), as a node pulling a pod's images does; returns them,
    /// or nothing when the import failed.
    pub(crate) async fn import(&mut self, images: &[usize]) -> Vec<usize> {
        *self.ops.entry("import").or_default() += images.len() as u64;
        let names: Vec<String> = images
            .iter()
            .map(|&i| self.images[i].built.name().to_string())
            .collect();
        let result = match images {
            [one] => self.bed.import_tarball(&self.images[*one].tarball, &names).await,
            _ => {
                let bundle = self.tarballs.join("bundle.tar");
                let tarballs: Vec<&Path> = images.iter().map(|&i| self.images[i].tarball.as_path()).collect();
                bundle_layouts(&tarballs, &bundle).unwrap_or_else(|e| panic!("writing {}: {e}", bundle.display()));
                self.bed.import_tarball(&bundle, &names).await
            }
        };
        match result {
            Ok(()) => images.to_vec(),
            Err(e) => {
                let refusal = format!("import {names:?}: {e}");
                self.count("import failed");
                self.refusals.push(refusal);
                Vec::new()
            }
        }
    }

    /// Imports a few images at once, waits for the daemon to start removing
    /// one of them, and at that moment creates a container on another: the
    /// race the re-check exists for, struck on purpose.
    pub(crate) async fn race(&mut self, images: &[usize]) {
        self.count("race");
        self.log.read();
        let from = self.log.len();
        let imported = self.import(images).await;
        if imported.is_empty() {
            return;
        }
        let deadline = Instant::now() + RACE_WAIT;
        let mut checked = None;
        while checked.is_none() && Instant::now() < deadline {
            checked = self.log.next_check(from, |id| {
                imported.iter().copied().find(|&i| self.images[i].built.id == id)
            });
            if checked.is_none() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let others: Vec<usize> = imported.iter().copied().filter(|&i| Some(i) != checked).collect();
        // Images with the same history are walked in id order, so the one
        // with the highest id is re-checked last: aim there, giving the
        // creation the most time to land before its re-check.
        let target = match checked {
            Some(_) => others.iter().copied().max_by_key(|&i| &self.images[i].built.id),
            None => {
                self.count("race: no removal seen");
                self.rng.pick(&others).copied()
            }
        };
        let Some(target) = target else {
            return;
        };
        let start = self.rng.chance(50);
        self.create(target, start, "create in race").await;
    }

    /// Imports a few images at once, waits for the re-check of the one the
    /// walk takes second (images with the same history are walked in id
    /// order), which the daemon makes ahead, beside the first one's
    /// removal, and creates a container on it once that re-check has long
    /// answered: a daemon that sends `RemoveImage` on the strength of that
    /// re-check after the look at the moving disk removes the image from
    /// under the container (c); one that re-checks again right before the
    /// call keeps it.
    pub(crate) async fn late_race(&mut self, images: &[usize]) {
        self.count("late race");
        self.log.read();
        let from = self.log.len();
        let mut imported = self.import(images).await;
        if imported.len() < 2 {
            return;
        }
        imported.sort_by(|&a, &b| self.images[a].built.id.cmp(&self.images[b].built.id));
        let target = imported[1];
        let target_id = self.images[target].built.id.clone();
        let deadline = Instant::now() + LATE_RACE_WAIT;
        let mut checked = false;
        while !checked && Instant::now() < deadline {
            checked = self
                .log
                .next_check(from, |id| (id == target_id).then_some(()))
                .is_some();
            if !checked {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        if !checked {
            self.count("late race: no re-check seen");
            return;
        }
        let delay = self.rng.between(LATE_RACE_DELAY_MS.0, LATE_RACE_DELAY_MS.1);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let start = self.rng.chance(50);
        self.create(target, start, "create in late race").await;
    }

    /// Imports a missing image and runs a container on it once CRI lists
    /// it, after a random delay: what a kubelet does after a pull, landing
    /// anywhere in the daemon's cycle.
    pub(crate) async fn pull_and_run(&mut self, image: usize) {
        if self.import(&[image]).await.is_empty() {
            return;
        }
        if !self.wait_visible(image).await {
            self.count("pulled image gone before the run");
            return;
        }
        let delay = self.rng.between(0, 700);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let start = self.rng.chance(70);
        self.create(image, start, "create after pull").await;
    }

    pub(crate) async fn wait_visible(&self, image: usize) -> bool {
        let deadline = Instant::now() + VISIBLE_WAIT;
        while Instant::now() < deadline {
            if self.bed.list_image_ids().await.contains(&self.images[image].built.id) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    pub(crate) async fn create(&mut self, image: usize, start: bool, op: &'static str) {
        let pod = self.pods[self.rng.below(self.pods.len() as u64) as usize].clone();
        let name = self.images[image].built.name().to_string();
        self.count(op);
        let create_sent = SystemTime::now();
        let result = self.bed.try_create_container(&pod, &name).await;
        let create_done = SystemTime::now();
        match result {
            Ok(id) => {
                self.lives.push(Life {
                    id,
                    image,
                    create_sent,
                    create_done,
                    start_done: None,
                    stop_sent: None,
                    remove_sent: None,
                });
                if start {
                    self.start(self.lives.len() - 1).await;
                }
            }
            Err(status) => {
                self.count("create refused");
                self.refusals.push(format!(
                    "CreateContainer {name} at +{} ms: {}",
                    self.ms(create_sent),
                    status.message()
                ));
            }
        }
    }

    pub(crate) async fn start(&mut self, i: usize) {
        self.count("start");
        let request = proto::StartContainerRequest {
            container_id: self.lives[i].id.0.clone(),
        };
        match self.bed.client().runtime_service().start_container(request).await {
            Ok(_) => self.lives[i].start_done = Some(SystemTime::now()),
            Err(status) => {
                self.count("start refused");
                let name = self.images[self.lives[i].image].built.name();
                self.refusals
                    .push(format!("StartContainer on {name}: {}", status.message()));
            }
        }
    }

    pub(crate) async fn stop(&mut self, i: usize) {
        self.count("stop");
        self.lives[i].stop_sent = Some(SystemTime::now());
        self.bed.stop_container(&self.lives[i].id).await;
    }

    pub(crate) async fn remove(&mut self, i: usize) {
        if self.lives[i].is_running() {
            self.stop(i).await;
        }
        self.count("remove");
        self.lives[i].remove_sent = Some(SystemTime::now());
        self.bed.remove_container(&self.lives[i].id).await;
    }

    /// Removes every container and pod left.
    pub(crate) async fn clean_up(&mut self) {
        for i in 0..self.lives.len() {
            if self.lives[i].is_live() {
                if self.lives[i].is_running() {
                    self.lives[i].stop_sent = Some(SystemTime::now());
                    self.bed.stop_container(&self.lives[i].id).await;
                }
                self.lives[i].remove_sent = Some(SystemTime::now());
                self.bed.remove_container(&self.lives[i].id).await;
            }
        }
        for pod in std::mem::take(&mut self.pods) {
            self.bed.stop_pod(&pod).await;
            self.bed.remove_pod(&pod).await;
        }
    }

    /// Milliseconds since the driver started.
    pub(crate) fn ms(&self, t: SystemTime) -> i64 {
        match t.duration_since(self.t0) {
            Ok(d) => d.as_millis() as i64,
            Err(e) => -(e.duration().as_millis() as i64),
        }
    }

    pub(crate) fn describe(&self, violation: &Violation, log: &[LogLine]) -> String {
        let removal = &violation.removal;
        let life = &self.lives[violation.life];
        let image = &self.images[life.image].built;
        let at =
            |t: Option<SystemTime>| t.map_or("never".to_string(), |t| format!("+{:.3} s", self.ms(t) as f64 / 1000.0));
        let mut text = format!(
            "  {} ({}) removal: re-check sent {}, removal began {}, {} {}\n    \
             container {}: create sent {}, create returned {}, start returned {}, stop sent {}, remove sent {} ({})\n",
            image.name(),
            image.id,
            at(Some(removal.check)),
            at(Some(removal.removal)),
            removal.outcome,
            at(removal.done),
            life.id.as_str(),
            at(Some(life.create_sent)),
            at(Some(life.create_done)),
            at(life.start_done),
            at(life.stop_sent),
            at(life.remove_sent),
            match violation.kind {
                Breach::Running => "(b) running",
                Breach::Existed => "(a) existed",
                Breach::Stale => "(c) created after the re-check answered",
            },
        );
        for line in log
            .iter()
            .filter(|l| l.image.as_deref() == Some(image.id.as_str()))
            .filter(|l| l.time.is_some_and(|t| t.duration_since(removal.check).is_ok()))
            .take(4)
        {
            let _ = writeln!(text, "    log: {}", line.raw);
        }
        text
    }
}

/// Merges OCI layout tarballs into one whose index lists every image, so
/// that one import takes them all (blobs they share are written once).
pub(crate) fn bundle_layouts(tarballs: &[&Path], out: &Path) -> std::io::Result<()> {
    let mut builder = tar::Builder::new(std::io::BufWriter::new(fs::File::create(out)?));
    let mut written = BTreeSet::new();
    let mut manifests = Vec::new();
    let mut layout = None;
    for tarball in tarballs {
        let mut archive = tar::Archive::new(fs::File::open(tarball)?);
        for entry in archive.entries()? {
            let mut entry = entry?;
            let path = entry.path()?.to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes)?;
            match path.as_str() {
                "index.json" => {
                    let index: Value = serde_json::from_slice(&bytes)?;
                    manifests.extend(index["manifests"].as_array().cloned().unwrap_or_default());
                }
                "oci-layout" => layout = Some(bytes),
                _ if written.insert(path.clone()) => {
                    let mut header = entry.header().clone();
                    builder.append_data(&mut header, &path, bytes.as_slice())?;
                }
                _ => {}
            }
        }
    }
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": crate::oci::INDEX_MEDIA_TYPE,
        "manifests": manifests,
    }))?;
    for (path, bytes) in [("oci-layout", layout.unwrap_or_default()), ("index.json", index)] {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, bytes.as_slice())?;
    }
    builder
        .into_inner()?
        .into_inner()
        .map_err(std::io::IntoInnerError::into_error)?
        .sync_all()
}
