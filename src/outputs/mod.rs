//! What imagegc says to the outside, apart from its commands' output: the
//! log's format ([`log`]), the registry every sink registers its metric
//! families in ([`metrics`]), liveness and readiness ([`health`]), and the listener
//! that serves them ([`http`]: `/metrics`, `/healthz`, `/readyz`). The
//! engine's events reach them through its sinks (`engine::sinks`).

pub mod health;
pub mod http;
pub mod log;
pub mod metrics;

/// Sizes for people: `512 B`, `1.5 KiB`, `230.0 MiB`, `1.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}
