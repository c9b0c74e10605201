//! The daemon as a user meets it: the loop (`imagegc::daemon::run`) driven
//! in-process against the fake CRI runtime and a simulated disk, and the
//! `imagegc` binary run as a child process against the same fake, checked
//! through its state file, its journal, `/metrics`, `/readyz`, its exit
//! status and its log.
//!
//! - [`restarts`]: what the next process knows of the images' use;
//! - [`age`]: the age guard;
//! - [`usage`]: image usage between cycles, polled or from container events;
//! - [`space`]: space passes between scheduled cycles;
//! - [`runtime_down`]: the runtime going away, and down at start;
//! - [`dry_run`]: dry run from the configuration and from `once`;
//! - [`metrics`]: metrics and probes;
//! - [`shutdown`]: cancellation and SIGTERM;
//! - [`reload`]: the configuration reloaded on SIGHUP;
//! - [`output`]: what the runtime says, printed and logged;
//! - [`usage_log`]: the usage log, recorded and replayed by `simulate`.

mod age;
mod dry_run;
mod metrics;
mod output;
mod reload;
mod restarts;
mod runtime_down;
mod shutdown;
mod space;
mod support;
mod usage;
mod usage_log;
