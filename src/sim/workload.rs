//! Synthetic workloads: four kinds of node, each a generator of a
//! [`Trace`] from a seed, its parameters from published figures where
//! there are any (docs/simulate.md lists each with its source) and chosen,
//! and said so, where there are none.
//!
//! Common to all: layer sizes are lognormal with a median of 2 MiB and a
//! 90th percentile of 63 MB (Docker Hub, compressed: about half of layers
//! under 4 MB, p90 63 MB [Zhao et al., CLUSTER'19]), between 1 KiB and
//! 2 GiB; images have 8 layers at the median and 18 at p90 (same source);
//! a layer is stored once however many images share it.
//!
//! - [`Kind::Service`]: a node of long-running services behind rolling
//!   deployments. 30 containers on the node (the median per host [Sysdig
//!   2019]) out of a pool of 45 services that pods of the cluster move
//!   between nodes (a residence of 3 days on average: no published figure),
//!   3 of them daemon sets that never leave; 4 shared base images (3 to 5,
//!   WORKLOADS.md). Each service gets a new version about weekly (half of
//!   images replaced within a week [Sysdig 2019]) that rebuilds its top 1
//!   to 3 layers [Starlight, NSDI'22]; each base is refreshed about monthly
//!   \[Anchore\], which rebuilds every image on it within a day. 5% of
//!   deployments are rolled back within the hour (no figure: swept 0 to
//!   10% in the model).
//! - [`Kind::Ci`]: a CI runner. 400 pipelines (200 to 1,000) chosen by a
//!   Zipf law of exponent 0.9 (no published exponent: 0.6 to 1.2), on 6 hot
//!   base images (themselves Zipf); image sizes from Uber Kraken's blob mix
//!   (59% under 100 MB, 35% to 1 GB, 6% above). A third of jobs follow a
//!   push of their pipeline, which rebuilds only its top (code) layer
//!   (pushes share about 97% of bytes [Brooker et al., ATC'23]; a push is
//!   soon pulled [Anwar et al., FAST'18]). Half of the jobs run a step in
//!   one of the base (tool) images themselves, as it is then. Jobs last 3 minutes at the
//!   median (half of containers live under 5 minutes [Sysdig 2019]);
//!   20 jobs an hour on weekdays, a third of that at weekends.
//! - [`Kind::Batch`]: a batch node. 30 job images of 0.5 to 5 GB, half of
//!   them on one of two large shared bases; each job runs periodically,
//!   its period log-uniform from 15 minutes to 14 days (invocation
//!   frequencies span 8 orders of magnitude [Shahrad et al., ATC'20]),
//!   20 minutes at the median; each image is rebuilt about monthly.
//! - [`Kind::Mixed`]: the three at once, scaled so that about 60% of the
//!   bytes pulled are the service part's, 30% CI and 10% batch
//!   (WORKLOADS.md's mix).
//!
//! A generator is deterministic: the same kind, seed and length give the
//! same trace.

use super::trace::{Action, Seconds, Trace, TraceEvent, TraceImage};

const MINUTE: Seconds = 60;
const HOUR: Seconds = 60 * MINUTE;
const DAY: Seconds = 24 * HOUR;

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * KIB;
const GIB: f64 = 1024.0 * MIB;

/// A workload's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Long-running services with rolling deployments.
    Service,
    /// A CI runner: many one-off images on a few hot bases.
    Ci,
    /// Large images, periodic jobs.
    Batch,
    /// Service, CI and batch at once.
    Mixed,
    /// Preview environments: a hot set, and images used a few times
    /// over a few hours, then never again.
    Preview,
}

impl Kind {
    /// Every kind, in the order reports list them.
    pub const ALL: [Kind; 5] = [Kind::Service, Kind::Ci, Kind::Batch, Kind::Mixed, Kind::Preview];

    /// The kind's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Service => "service",
            Kind::Ci => "ci",
            Kind::Batch => "batch",
            Kind::Mixed => "mixed",
            Kind::Preview => "preview",
        }
    }

    /// The trace of `days` days of this workload from `seed`, with the
    /// documented parameters.
    pub fn generate(self, seed: u64, days: u64) -> Trace {
        self.generate_with(seed, days, Sweep::default())
    }

    /// The trace of `days` days of this workload from `seed`, with the
    /// parameters no one measured set as `sweep` says.
    pub fn generate_with(self, seed: u64, days: u64, sweep: Sweep) -> Trace {
        let until = days.saturating_mul(DAY);
        let mut b = Builder::new(seed, until);
        let service_params = ServiceParams {
            rollback: sweep.rollback.unwrap_or(ServiceParams::default().rollback),
            ..ServiceParams::default()
        };
        let ci_params = CiParams {
            alpha: sweep.zipf_alpha.unwrap_or(CiParams::default().alpha),
            ..CiParams::default()
        };
        match self {
            Kind::Service => service(&mut b, until, &service_params),
            Kind::Ci => ci(&mut b, until, &ci_params),
            Kind::Batch => batch(&mut b, until, &BatchParams::default()),
            Kind::Mixed => {
                service(
                    &mut b,
                    until,
                    &ServiceParams {
                        pool: 27,
                        on_node: 18,
                        ..service_params
                    },
                );
                ci(
                    &mut b,
                    until,
                    &CiParams {
                        pipelines: 150,
                        jobs_per_hour: 6.0,
                        ..ci_params
                    },
                );
                batch(
                    &mut b,
                    until,
                    &BatchParams {
                        images: 6,
                        ..BatchParams::default()
                    },
                );
            }
            Kind::Preview => preview(&mut b, until, &PreviewParams::default()),
        }
        b.finish()
    }
}

/// The parameters no published figure gives, set for a sweep (`None`: the
/// documented default).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sweep {
    /// The Zipf exponent of CI pipelines' popularity (default 0.9; 0.6 to
    /// 1.2 is the range to sweep).
    pub zipf_alpha: Option<f64>,
    /// The share of service deployments rolled back within the hour
    /// (default 0.05; 0 to 0.1).
    pub rollback: Option<f64>,
}

/// A small deterministic generator (SplitMix64): the simulation needs
/// reproducible draws, not cryptographic ones.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Log-uniform in [lo, hi): every factor of ten as likely.
    pub fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + (hi.ln() - lo.ln()) * self.unit()).exp()
    }

    /// A standard normal draw (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit(); // (0, 1]: no log of 0
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Lognormal with the given median and 90th percentile.
    pub fn lognormal(&mut self, median: f64, p90: f64) -> f64 {
        let sigma = (p90 / median).ln() / 1.281_551_565_5;
        median * (sigma * self.normal()).exp()
    }

    /// Exponential with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// A Zipf law over `0..n`: rank `k` drawn with weight `1/(k+1)^alpha`.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Over `n` ranks (at least 1) with exponent `alpha`.
    pub fn new(n: usize, alpha: f64) -> Self {
        let mut cdf = Vec::with_capacity(n.max(1));
        let mut sum = 0.0;
        for k in 0..n.max(1) {
            sum += 1.0 / ((k + 1) as f64).powf(alpha);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { cdf }
    }

    /// A rank.
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c <= u).min(self.cdf.len() - 1)
    }
}

/// Builds a trace: layers, images, containers.
struct Builder {
    rng: Rng,
    trace: Trace,
    next_container: u64,
    /// The end of the trace: containers still there go then.
    end: Seconds,
}

impl Builder {
    fn new(seed: u64, end: Seconds) -> Self {
        Builder {
            rng: Rng::new(seed),
            trace: Trace::default(),
            next_container: 0,
            end,
        }
    }

    fn layer(&mut self, bytes: f64) -> u32 {
        let index = self.trace.layers.len() as u32;
        self.trace.layers.push(bytes.clamp(KIB, 2.0 * GIB) as u64);
        index
    }

    /// A layer of the common size law.
    fn any_layer(&mut self) -> u32 {
        let bytes = self.rng.lognormal(2.0 * MIB, 63e6);
        self.layer(bytes)
    }

    /// `count` layers sharing `bytes` between them at random.
    fn layers_of(&mut self, bytes: f64, count: usize) -> Vec<u32> {
        let weights: Vec<f64> = (0..count.max(1)).map(|_| self.rng.exponential(1.0)).collect();
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| self.layer(bytes * w / total)).collect()
    }

    /// A layer count of the common law (median 8, p90 18), at least 1.
    fn layer_count(&mut self) -> usize {
        self.rng.lognormal(8.0, 18.0).round().clamp(1.0, 120.0) as usize
    }

    fn image(&mut self, name: String, layers: Vec<u32>) -> u32 {
        let index = self.trace.images.len() as u32;
        self.trace.images.push(TraceImage {
            id: format!("sha256:{index:064x}"),
            name,
            layers,
        });
        index
    }

    /// A container of `image` from `from` to `until` (or the end).
    fn run(&mut self, image: u32, from: Seconds, until: Seconds) {
        if from >= self.end {
            return;
        }
        let until = until.min(self.end);
        let container = self.next_container;
        self.next_container += 1;
        self.trace.events.push(TraceEvent {
            at: from,
            action: Action::Start { container, image },
        });
        self.trace.events.push(TraceEvent {
            at: until.max(from),
            action: Action::Stop { container },
        });
    }

    fn finish(mut self) -> Trace {
        self.trace.sort();
        self.trace
    }
}

fn secs(value: f64) -> Seconds {
    value.max(0.0) as Seconds
}

struct ServiceParams {
    pool: usize,
    on_node: usize,
    daemon_sets: usize,
    bases: usize,
    deploy_every_days: f64,
    base_refresh_days: f64,
    rollback: f64,
    residence_days: f64,
}

impl Default for ServiceParams {
    fn default() -> Self {
        ServiceParams {
            pool: 45,
            on_node: 30,
            daemon_sets: 3,
            bases: 4,
            deploy_every_days: 7.0,
            base_refresh_days: 30.0,
            rollback: 0.05,
            residence_days: 3.0,
        }
    }
}

/// One service's life on the node: versions over time, and when its pod
/// is here.
fn service(b: &mut Builder, until: Seconds, p: &ServiceParams) {
    // Bases: a few layers each; refreshed about monthly.
    let mut bases: Vec<Vec<(Seconds, Vec<u32>)>> = Vec::new();
    for _ in 0..p.bases {
        let mut versions = Vec::new();
        let count = 2 + b.rng.below(4) as usize;
        let layers = (0..count).map(|_| b.any_layer()).collect();
        versions.push((0, layers));
        let mut t = secs(b.rng.uniform(0.0, p.base_refresh_days * DAY as f64));
        while t < until {
            let layers = (0..count).map(|_| b.any_layer()).collect();
            versions.push((t, layers));
            t += secs(b.rng.uniform(0.8, 1.2) * p.base_refresh_days * DAY as f64);
        }
        bases.push(versions);
    }
    let away_fraction = 1.0 - p.on_node as f64 / p.pool as f64;
    let away_days = p.residence_days * away_fraction / (1.0 - away_fraction).max(0.01);
    for s in 0..p.pool {
        let daemon_set = s < p.daemon_sets;
        let base = b.rng.below(p.bases as u64) as usize;
        // Version changes: own deployments, and each base refresh rolled
        // out within a day.
        let mut changes: Vec<Seconds> = bases[base][1..]
            .iter()
            .map(|(at, _)| at + secs(b.rng.uniform(0.0, DAY as f64)))
            .collect();
        let mut t = secs(b.rng.exponential(p.deploy_every_days * DAY as f64));
        while t < until {
            changes.push(t);
            t += secs(b.rng.exponential(p.deploy_every_days * DAY as f64)).max(HOUR);
        }
        changes.sort_unstable();
        // The service's own layers on top of its base.
        let own = b.layer_count().saturating_sub(bases[base][0].1.len()).max(2);
        let mut app: Vec<u32> = (0..own).map(|_| b.any_layer()).collect();
        let base_at = |t: Seconds| -> &Vec<u32> {
            let versions = &bases[base];
            let i = versions.partition_point(|(at, _)| *at <= t).saturating_sub(1);
            &versions[i].1
        };
        let mut base_now = base_at(0).clone();
        let mut version = 0;
        let name = |v: usize| format!("registry.example/svc-{s}:v{v}");
        let mut image = b.image(name(0), [base_now.clone(), app.clone()].concat());
        // Residence: alternating stays and absences.
        let mut here = daemon_set || b.rng.chance(1.0 - away_fraction);
        let mut toggle = if daemon_set {
            Seconds::MAX
        } else {
            let mean = if here { p.residence_days } else { away_days };
            secs(b.rng.exponential(mean * DAY as f64))
        };
        let mut since = 0;
        let mut changes = changes.into_iter().peekable();
        let mut now = 0;
        loop {
            let next_change = changes.peek().copied().unwrap_or(Seconds::MAX);
            let next = next_change.min(toggle);
            if next >= until {
                if here {
                    b.run(image, since, until);
                }
                break;
            }
            now = now.max(next);
            if next == toggle {
                if here {
                    b.run(image, since, now);
                } else {
                    since = now;
                }
                here = !here;
                let mean = if here { p.residence_days } else { away_days };
                toggle = now + secs(b.rng.exponential(mean * DAY as f64)).max(MINUTE);
                continue;
            }
            changes.next();
            // A new version: a new base when the base changed (every layer
            // above it rebuilt), else the top 1 to 3 layers rebuilt.
            let previous = image;
            let base_then = base_at(now).clone();
            if base_then == base_now {
                let rebuilt = (1 + b.rng.below(3) as usize).min(app.len());
                let keep = app.len() - rebuilt;
                app.truncate(keep);
                for _ in 0..rebuilt {
                    let layer = b.any_layer();
                    app.push(layer);
                }
            } else {
                base_now = base_then;
                app = (0..app.len()).map(|_| b.any_layer()).collect();
            }
            version += 1;
            image = b.image(name(version), [base_now.clone(), app.clone()].concat());
            if here {
                // Rolling: the new pod starts, the old one goes a minute later.
                b.run(previous, since, now + MINUTE);
                since = now;
                if b.rng.chance(p.rollback) {
                    let back = now + secs(b.rng.uniform(5.0, 60.0) * MINUTE as f64);
                    if back < next_change_after(&mut changes, toggle) && back < until {
                        b.run(image, since, back + MINUTE);
                        image = previous;
                        since = back;
                        now = back;
                    }
                }
            }
        }
    }
}

/// The earlier of the next version change and the next move.
fn next_change_after(changes: &mut std::iter::Peekable<std::vec::IntoIter<Seconds>>, toggle: Seconds) -> Seconds {
    changes.peek().copied().unwrap_or(Seconds::MAX).min(toggle)
}

struct CiParams {
    pipelines: usize,
    alpha: f64,
    bases: usize,
    jobs_per_hour: f64,
    push_share: f64,
    tool_share: f64,
}

impl Default for CiParams {
    fn default() -> Self {
        CiParams {
            pipelines: 400,
            alpha: 0.9,
            bases: 6,
            jobs_per_hour: 20.0,
            push_share: 1.0 / 3.0,
            tool_share: 0.5,
        }
    }
}

/// An image size from Uber Kraken's blob mix: 59% under 100 MB, 35% from
/// 100 MB to 1 GB, 6% from 1 to 4 GB (log-uniform within each).
fn kraken_size(rng: &mut Rng) -> f64 {
    let u = rng.unit();
    if u < 0.59 {
        rng.log_uniform(10e6, 100e6)
    } else if u < 0.94 {
        rng.log_uniform(100e6, 1e9)
    } else {
        rng.log_uniform(1e9, 4e9)
    }
}

/// `count` shared bases of 3 to 5 layers, each of the bytes `size` draws,
/// rebuilt every 30 days from a first refresh within the first month:
/// (from, layers) per version, per base.
fn monthly_bases(
    b: &mut Builder,
    count: usize,
    until: Seconds,
    mut size: impl FnMut(&mut Rng) -> f64,
) -> Vec<Vec<(Seconds, Vec<u32>)>> {
    (0..count)
        .map(|_| {
            let bytes = size(&mut b.rng);
            let layers = 3 + b.rng.below(3) as usize;
            let mut versions = vec![(0, b.layers_of(bytes, layers))];
            let mut t = secs(b.rng.uniform(0.0, 30.0 * DAY as f64));
            while t < until {
                versions.push((t, b.layers_of(bytes, layers)));
                t += 30 * DAY;
            }
            versions
        })
        .collect()
}

fn ci(b: &mut Builder, until: Seconds, p: &CiParams) {
    // Hot bases, refreshed monthly.
    let bases = monthly_bases(b, p.bases, until, |rng| 0.6 * kraken_size(rng));
    let base_law = Zipf::new(p.bases, 1.0);
    struct Pipeline {
        base: usize,
        base_version: usize,
        deps: Vec<u32>,
        deps_bytes: f64,
        code_bytes: f64,
        image: u32,
        pushes: u32,
    }
    let mut pipelines = Vec::with_capacity(p.pipelines);
    for n in 0..p.pipelines {
        let base = base_law.sample(&mut b.rng);
        // The pipeline's own part: dependencies (37% of the image) and code (3%).
        let own = 0.4 * kraken_size(&mut b.rng);
        let deps_bytes = own * 0.925;
        let code_bytes = own * 0.075;
        let count = 1 + b.rng.below(3) as usize;
        let deps = b.layers_of(deps_bytes, count);
        let code = b.layer(code_bytes);
        let image = b.image(
            format!("ci.example/p{n}:0"),
            [bases[base][0].1.clone(), deps.clone(), vec![code]].concat(),
        );
        pipelines.push(Pipeline {
            base,
            base_version: 0,
            deps,
            deps_bytes,
            code_bytes,
            image,
            pushes: 0,
        });
    }
    let law = Zipf::new(p.pipelines, p.alpha);
    let mut tools: std::collections::HashMap<(usize, usize), u32> = std::collections::HashMap::new();
    // Jobs: a Poisson process, slower at night and at weekends.
    let mut t = 0;
    loop {
        let rate = p.jobs_per_hour * ci_rate(t);
        t += secs(b.rng.exponential(HOUR as f64 / rate)).max(1);
        if t >= until {
            break;
        }
        let length = secs(b.rng.lognormal(3.0 * MINUTE as f64, 15.0 * MINUTE as f64)).clamp(10, 2 * HOUR);
        if b.rng.chance(p.tool_share) {
            // A step in a base (tool) image itself, as it is now.
            let base = base_law.sample(&mut b.rng);
            let version = bases[base].partition_point(|(at, _)| *at <= t).saturating_sub(1);
            let image = match tools.get(&(base, version)) {
                Some(&image) => image,
                None => {
                    let layers = bases[base][version].1.clone();
                    let image = b.image(format!("docker.example/tool-{base}:{version}"), layers);
                    tools.insert((base, version), image);
                    image
                }
            };
            b.run(image, t, t + length);
            continue;
        }
        let which = law.sample(&mut b.rng);
        let pipeline = &mut pipelines[which];
        if b.rng.chance(p.push_share) {
            // A push: the code layer rebuilt; on a refreshed base, the
            // dependencies too.
            let versions = &bases[pipeline.base];
            let latest = versions.partition_point(|(at, _)| *at <= t).saturating_sub(1);
            if latest != pipeline.base_version {
                pipeline.base_version = latest;
                let count = pipeline.deps.len();
                pipeline.deps = b.layers_of(pipeline.deps_bytes, count);
            }
            let code = b.layer(pipeline.code_bytes);
            pipeline.pushes += 1;
            pipeline.image = b.image(
                format!("ci.example/p{which}:{}", pipeline.pushes),
                [
                    versions[pipeline.base_version].1.clone(),
                    pipeline.deps.clone(),
                    vec![code],
                ]
                .concat(),
            );
        }
        let image = pipeline.image;
        b.run(image, t, t + length);
    }
}

/// The CI job rate's shape: full on weekday working hours (8 to 18), a
/// third at night and at weekends (a mild weekend dip [Anwar18]).
fn ci_rate(t: Seconds) -> f64 {
    let day = (t / DAY) % 7;
    let hour = (t % DAY) / HOUR;
    if day >= 5 || !(8..18).contains(&hour) {
        1.0 / 3.0
    } else {
        1.0
    }
}

struct BatchParams {
    images: usize,
    rebuild_days: f64,
}

impl Default for BatchParams {
    fn default() -> Self {
        BatchParams {
            images: 30,
            rebuild_days: 30.0,
        }
    }
}

fn batch(b: &mut Builder, until: Seconds, p: &BatchParams) {
    let shared: Vec<Vec<u32>> = (0..2)
        .map(|_| {
            let bytes = b.rng.uniform(1.5, 3.0) * GIB;
            b.layers_of(bytes, 4)
        })
        .collect();
    for n in 0..p.images {
        let bytes = b.rng.log_uniform(0.5 * GIB, 5.0 * GIB);
        let base: Vec<u32> = if n % 2 == 0 {
            shared[(n / 2) % 2].clone()
        } else {
            Vec::new()
        };
        let own = if base.is_empty() {
            bytes
        } else {
            (bytes * 0.4).max(0.1 * GIB)
        };
        let count = 2 + b.rng.below(4) as usize;
        let mut layers = b.layers_of(own, count);
        let name = |v: u32| format!("batch.example/job-{n}:{v}");
        let mut version = 0;
        let mut image = b.image(name(0), [base.clone(), layers.clone()].concat());
        let period = b.rng.log_uniform(15.0 * MINUTE as f64, 14.0 * DAY as f64);
        let mut rebuild = secs(b.rng.exponential(p.rebuild_days * DAY as f64));
        let mut t = secs(b.rng.uniform(0.0, period));
        while t < until {
            if t >= rebuild {
                // The top layer rebuilt.
                let top = layers.len() - 1;
                let bytes = b.trace.layers[layers[top] as usize] as f64;
                layers[top] = b.layer(bytes);
                version += 1;
                image = b.image(name(version), [base.clone(), layers.clone()].concat());
                rebuild = t + secs(b.rng.exponential(p.rebuild_days * DAY as f64));
            }
            let length = secs(b.rng.lognormal(20.0 * MINUTE as f64, 2.0 * HOUR as f64)).clamp(MINUTE, DAY);
            b.run(image, t, t + length);
            t += secs(period * b.rng.uniform(0.9, 1.1)).max(MINUTE);
        }
    }
}

struct PreviewParams {
    services: usize,
    hot: usize,
    bases: usize,
    opened_per_hour: f64,
    life_median_hours: f64,
    push_every_hours: f64,
    merged: f64,
}

impl Default for PreviewParams {
    fn default() -> Self {
        PreviewParams {
            services: 5,
            hot: 60,
            bases: 2,
            opened_per_hour: 2.0,
            life_median_hours: 3.0,
            push_every_hours: 2.0,
            merged: 0.7,
        }
    }
}

/// Preview environments (see [`Kind::Preview`]).
fn preview(b: &mut Builder, until: Seconds, p: &PreviewParams) {
    let hot: Vec<u32> = (0..p.hot)
        .map(|n| {
            let bytes = kraken_size(&mut b.rng).min(2.0 * GIB);
            let count = 2 + b.rng.below(4) as usize;
            let layers = b.layers_of(bytes, count);
            b.image(format!("docker.example/dep-{n}:1"), layers)
        })
        .collect();
    let hot_law = Zipf::new(p.hot, 1.0);
    // Bases, refreshed monthly.
    let bases = monthly_bases(b, p.bases, until, |rng| rng.log_uniform(200e6, 800e6));
    struct Service {
        base: usize,
        deps_bytes: f64,
        code_bytes: f64,
        /// The dependencies' layers, and the base version they were built on.
        deps: (usize, Vec<u32>),
        /// The image `main` runs now.
        main: u32,
        builds: u32,
    }
    let base_at = |bases: &[Vec<(Seconds, Vec<u32>)>], base: usize, t: Seconds| {
        bases[base].partition_point(|(at, _)| *at <= t).saturating_sub(1)
    };
    // A build of service `s` at `t`: a new code layer, new dependencies
    // when the base moved or (one build in five) they changed.
    let build = |b: &mut Builder,
                 bases: &[Vec<(Seconds, Vec<u32>)>],
                 service: &mut Service,
                 (s, branch): (usize, &str),
                 t: Seconds| {
        let version = base_at(bases, service.base, t);
        if version != service.deps.0 || b.rng.chance(0.1) {
            let count = service.deps.1.len();
            service.deps = (version, b.layers_of(service.deps_bytes, count));
        }
        let code = b.layer(service.code_bytes);
        service.builds += 1;
        let layers = [
            bases[service.base][version].1.clone(),
            service.deps.1.clone(),
            vec![code],
        ]
        .concat();
        b.image(format!("preview.example/{branch}/svc-{s}:b{}", service.builds), layers)
    };
    let mut services = Vec::with_capacity(p.services);
    for s in 0..p.services {
        let own = b.rng.log_uniform(60e6, 400e6);
        let count = 2 + b.rng.below(3) as usize;
        let base = s % p.bases;
        let deps = b.layers_of(own * 0.9, count);
        let mut service = Service {
            base,
            deps_bytes: own * 0.9,
            code_bytes: own * 0.1,
            deps: (0, deps),
            main: 0,
            builds: 0,
        };
        service.main = build(b, &bases, &mut service, (s, "main"), 0);
        services.push(service);
    }
    // Pull requests: a Poisson process, slower at night and at weekends.
    let mut merges: Vec<(Seconds, usize, u32)> = Vec::new();
    let mut t = 0;
    for pull_request in 1.. {
        let rate = p.opened_per_hour * ci_rate(t);
        t += secs(b.rng.exponential(HOUR as f64 / rate)).max(1);
        if t >= until {
            break;
        }
        // Merges that happened by now move `main`.
        merges.sort_unstable();
        let done = merges.partition_point(|&(at, _, _)| at <= t);
        for (_, s, image) in merges.drain(..done) {
            services[s].main = image;
        }
        let life = secs(b.rng.lognormal(
            p.life_median_hours * HOUR as f64,
            4.0 * p.life_median_hours * HOUR as f64,
        ))
        .clamp(30 * MINUTE, 2 * DAY);
        let end = t + life;
        let changed_count = 1 + b.rng.below(3) as usize;
        let mut changed: Vec<usize> = Vec::with_capacity(changed_count);
        while changed.len() < changed_count.min(p.services) {
            let s = b.rng.below(p.services as u64) as usize;
            if !changed.contains(&s) {
                changed.push(s);
            }
        }
        // Pushes in its life, each a new build of the services it changes.
        let mut pushes = vec![t];
        let mut at = t + secs(b.rng.exponential(p.push_every_hours * HOUR as f64));
        while at < end {
            pushes.push(at);
            at += secs(b.rng.exponential(p.push_every_hours * HOUR as f64)).max(MINUTE);
        }
        let mut images_at: Vec<(Seconds, Vec<u32>)> = Vec::with_capacity(pushes.len());
        let branch = format!("pr-{pull_request}");
        for &at in &pushes {
            let own: Vec<u32> = changed
                .iter()
                .map(|&s| build(b, &bases, &mut services[s], (s, &branch), at))
                .collect();
            images_at.push((at, own));
        }
        let unchanged: Vec<u32> = (0..p.services)
            .filter(|s| !changed.contains(s))
            .map(|s| services[s].main)
            .collect();
        // Wakes: the first when it opens, the others at random in its life.
        let wakes = 2 + b.rng.below(5);
        let mut starts: Vec<Seconds> = vec![t];
        starts.extend((1..wakes).map(|_| t + b.rng.below(life.max(1))));
        starts.sort_unstable();
        for start in starts {
            let length = secs(b.rng.uniform(10.0, 60.0) * MINUTE as f64);
            let i = images_at.partition_point(|(at, _)| *at <= start).saturating_sub(1);
            for &image in &images_at[i].1 {
                b.run(image, start, start + length);
            }
            // The services it does not change, one of them in two.
            for &image in &unchanged {
                if b.rng.chance(0.5) {
                    b.run(image, start, start + length);
                }
            }
            for _ in 0..1 + b.rng.below(3) {
                let image = hot[hot_law.sample(&mut b.rng)];
                b.run(image, start, start + length);
            }
        }
        if b.rng.chance(p.merged) {
            let last = images_at.last().map(|(_, own)| own.clone()).unwrap_or_default();
            for (&s, image) in changed.iter().zip(last) {
                merges.push((end, s, image));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_seed_gives_one_trace_and_another_seed_another() {
        for kind in Kind::ALL {
            let a = kind.generate(7, 3);
            assert_eq!(a, kind.generate(7, 3), "{kind:?}");
            assert_ne!(a, kind.generate(8, 3), "{kind:?}");
        }
    }

    #[test]
    fn every_container_starts_once_and_stops_after_it_starts_in_time_order() {
        for kind in Kind::ALL {
            let trace = kind.generate(1, 14);
            assert!(trace.events.windows(2).all(|w| w[0].at <= w[1].at), "{kind:?}");
            let mut started: HashMap<u64, Seconds> = HashMap::new();
            let mut stopped = 0;
            for event in &trace.events {
                match event.action {
                    Action::Start { container, image } => {
                        assert!((image as usize) < trace.images.len());
                        assert!(started.insert(container, event.at).is_none(), "{kind:?}: started twice");
                    }
                    Action::Stop { container } => {
                        assert!(started[&container] <= event.at);
                        stopped += 1;
                    }
                }
            }
            assert_eq!(stopped, started.len(), "{kind:?}: every container goes by the end");
            assert!(trace.duration() <= 14 * DAY);
        }
    }

    #[test]
    fn the_workloads_have_their_documented_shape() {
        let days = 30;
        // Service: 30 pods on the node at a time, give or take moves.
        let service = Kind::Service.generate(3, days);
        let mut running = 0i64;
        let mut peak = 0;
        for e in &service.events {
            running += if matches!(e.action, Action::Start { .. }) {
                1
            } else {
                -1
            };
            peak = peak.max(running);
        }
        assert!((25..=50).contains(&peak), "service peak containers {peak}");
        // CI: many jobs, most images used only a few times, a few hot.
        let ci = Kind::Ci.generate(3, days);
        let mut uses: HashMap<u32, u32> = HashMap::new();
        for e in &ci.events {
            if let Action::Start { image, .. } = e.action {
                *uses.entry(image).or_default() += 1;
            }
        }
        let jobs: u32 = uses.values().sum();
        assert!(jobs > 5_000, "{jobs} jobs in {days} days");
        let once = uses.values().filter(|&&n| n == 1).count();
        assert!(
            once * 3 > uses.len(),
            "many CI images are used once ({once} of {})",
            uses.len()
        );
        assert!(uses.values().any(|&n| n > 50), "a few images are hot");
        // Batch: large images.
        let batch = Kind::Batch.generate(3, days);
        let smallest = (0..batch.images.len() as u32)
            .map(|i| batch.image_bytes(i))
            .min()
            .unwrap();
        assert!(smallest as f64 >= 0.4 * GIB, "{smallest}");
        // Preview: most images are used a few times within two days of
        // their first use, never after; a hot set is used all month.
        let preview = Kind::Preview.generate(3, days);
        let mut spans: HashMap<u32, (u32, Seconds, Seconds)> = HashMap::new();
        for e in &preview.events {
            if let Action::Start { image, .. } = e.action {
                let span = spans.entry(image).or_insert((0, e.at, e.at));
                span.0 += 1;
                span.2 = e.at;
            }
        }
        let brief = spans
            .values()
            .filter(|&&(n, first, last)| n <= 12 && last - first <= 2 * DAY)
            .count();
        assert!(
            brief * 10 >= spans.len() * 8,
            "{brief} of {} images used briefly",
            spans.len()
        );
        let hot = spans
            .values()
            .filter(|&&(n, first, last)| n > 100 && last - first > 20 * DAY)
            .count();
        assert!(hot >= 5, "{hot} hot images");
        // Every workload pulls more over a month than it ever has in use
        // at once: which images a collector keeps matters.
        for kind in Kind::ALL {
            let trace = kind.generate(1, days);
            assert!(trace.unique_bytes() > 2 * trace.peak_in_use_bytes(), "{kind:?}");
        }
    }

    #[test]
    fn a_sweep_changes_only_what_it_names() {
        let default = Kind::Ci.generate(5, 7);
        assert_eq!(
            Kind::Batch.generate_with(
                5,
                7,
                Sweep {
                    zipf_alpha: Some(1.2),
                    rollback: Some(0.1)
                }
            ),
            Kind::Batch.generate(5, 7)
        );
        let skewed = Kind::Ci.generate_with(
            5,
            7,
            Sweep {
                zipf_alpha: Some(1.2),
                ..Sweep::default()
            },
        );
        let distinct = |t: &Trace| {
            let mut seen: Vec<u32> = t
                .events
                .iter()
                .filter_map(|e| match e.action {
                    Action::Start { image, .. } => Some(image),
                    Action::Stop { .. } => None,
                })
                .collect();
            seen.sort_unstable();
            seen.dedup();
            seen.len()
        };
        // A steeper popularity law runs fewer distinct images.
        assert!(
            distinct(&skewed) < distinct(&default),
            "{} vs {}",
            distinct(&skewed),
            distinct(&default)
        );
    }

    #[test]
    fn zipf_ranks_follow_their_weights() {
        let law = Zipf::new(10, 1.0);
        let mut rng = Rng::new(1);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[law.sample(&mut rng)] += 1;
        }
        // Rank 1 is drawn twice as often as rank 2, ten times as often as rank 10.
        let ratio = f64::from(counts[0]) / f64::from(counts[1]);
        assert!((1.8..2.2).contains(&ratio), "{ratio}");
        let ratio = f64::from(counts[0]) / f64::from(counts[9]);
        assert!((8.5..11.5).contains(&ratio), "{ratio}");
    }
}
