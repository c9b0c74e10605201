//! `imagegc history`: removals from the audit journal, newest last. Reads
//! without a lock and writes nothing.

use std::time::SystemTime;

use super::table::{Table, human_bytes, short_id, tags_cell};
use super::{CliError, ExitStatus, Output, out};
use crate::config::Config;
use crate::store::journal::Journal;
use crate::store::state::StateStore;

/// `history`: removals from the journal.
#[expect(
    clippy::disallowed_methods,
    reason = "history --since is relative to the wall clock, as the journal's stamps are"
)]
pub fn history(config: &Config, since: Option<&str>, output: Output) -> Result<ExitStatus, CliError> {
    let since = match since {
        Some(s) => {
            let d = crate::config::parse_duration(s).map_err(|e| CliError::Usage(format!("--since: {e}")))?;
            Some(SystemTime::now().checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH))
        }
        None => None,
    };
    StateStore::new(&config.state.dir).check_dir()?;
    let journal = Journal::new(&config.state.dir);
    let entries = journal.read(since).map_err(anyhow::Error::from)?;
    if output == Output::Json {
        out::json(&entries)?;
        return Ok(0);
    }
    if entries.is_empty() {
        out::text(&format!("no removals recorded in {}\n", journal.path().display()))?;
        return Ok(0);
    }
    let mut table = Table::new(["TIME", "IMAGE ID", "TAGS", "REASON", "FREED", "LAST USED"]);
    for e in &entries {
        table.row([
            e.time.clone(),
            short_id(&e.image),
            tags_cell(&e.tags),
            if e.dry_run {
                format!("{} (dry run)", e.reason)
            } else {
                e.reason.clone()
            },
            e.freed_bytes.map_or("-".to_string(), human_bytes),
            e.last_used.clone(),
        ]);
    }
    out::text(&table.render())?;
    Ok(0)
}
