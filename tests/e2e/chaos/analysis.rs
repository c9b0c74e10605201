//! The daemon's removals read back from its log, checked against what the driver wrote down.

use super::*;

/// A removal that began, from the daemon's log.
#[derive(Debug, Clone)]
pub(crate) struct Removal {
    pub(crate) image: String,
    /// When the re-check of the containers was about to be sent.
    pub(crate) check: SystemTime,
    /// When the re-check had found no user and `RemoveImage` was next.
    pub(crate) removal: SystemTime,
    /// When the outcome was logged, after `RemoveImage` returned.
    pub(crate) done: Option<SystemTime>,
    pub(crate) outcome: &'static str,
}

#[derive(Debug)]
pub(crate) struct Violation {
    pub(crate) removal: Removal,
    pub(crate) life: usize,
    pub(crate) kind: Breach,
}

/// Which of the checks a removal broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Breach {
    /// (a) a container the re-check saw existed when the removal began.
    Existed,
    /// (b) one it saw was running.
    Running,
    /// (c) one created after the re-check answered existed.
    Stale,
}

#[derive(Debug)]
pub(crate) struct Window {
    pub(crate) container: String,
    pub(crate) image: String,
    pub(crate) running: bool,
}

/// The daemon's removals checked against the driver's record.
pub(crate) struct Analysis {
    pub(crate) removals: Vec<Removal>,
    pub(crate) saves: usize,
    pub(crate) violations: Vec<Violation>,
    pub(crate) window: Vec<Window>,
}

impl Analysis {
    pub(crate) fn of(log: &[LogLine], driver: &Driver<'_>) -> Analysis {
        let removals = removals(log);
        let saves = log.iter().filter(|l| l.message == KEPT_MESSAGE).count();
        let by_id: HashMap<&str, usize> = driver
            .images
            .iter()
            .enumerate()
            .map(|(i, image)| (image.built.id.as_str(), i))
            .collect();
        let mut violations = Vec::new();
        let mut window = Vec::new();
        for removal in &removals {
            let Some(&image) = by_id.get(removal.image.as_str()) else {
                continue;
            };
            for (i, life) in driver.lives.iter().enumerate().filter(|(_, l)| l.image == image) {
                if life.seen_through(removal.check, removal.removal) {
                    violations.push(Violation {
                        removal: removal.clone(),
                        life: i,
                        kind: if life.running_at(removal.removal) {
                            Breach::Running
                        } else {
                            Breach::Existed
                        },
                    });
                } else if life.created_after_answer(removal.check, removal.removal) {
                    violations.push(Violation {
                        removal: removal.clone(),
                        life: i,
                        kind: Breach::Stale,
                    });
                } else if life.created_across(removal.check, removal.done) {
                    window.push(Window {
                        container: life.id.0.clone(),
                        image: removal.image.clone(),
                        running: life.running_at(removal.removal),
                    });
                }
            }
        }
        Analysis {
            removals,
            saves,
            violations,
            window,
        }
    }
}

/// Pairs each "removing it" line with the re-check line before it for the
/// same image, and notes how the removal ended. Panics when the log does not
/// have that shape: the test would otherwise check nothing.
pub(crate) fn removals(log: &[LogLine]) -> Vec<Removal> {
    let mut removals: Vec<Removal> = Vec::new();
    let mut pending: Option<(String, SystemTime)> = None;
    for line in log {
        let image = || {
            line.image
                .clone()
                .unwrap_or_else(|| panic!("a removal line without an image field: {}", line.raw))
        };
        let time = || {
            line.time
                .unwrap_or_else(|| panic!("a removal line without a timestamp: {}", line.raw))
        };
        match line.message.as_str() {
            CHECK_MESSAGE => pending = Some((image(), time())),
            REMOVING_MESSAGE => {
                let (checked, check) = pending
                    .take()
                    .unwrap_or_else(|| panic!("a removal without a re-check before it: {}", line.raw));
                assert_eq!(
                    checked,
                    image(),
                    "the re-check before {} was for another image",
                    line.raw
                );
                removals.push(Removal {
                    image: image(),
                    check,
                    removal: time(),
                    done: None,
                    outcome: "unknown (the daemon stopped)",
                });
            }
            KEPT_MESSAGE => pending = None,
            // The re-check went stale between its answer and the call: no
            // removal was sent on it (the daemon re-checks again, or keeps
            // the image).
            message if message.starts_with(STALE_MESSAGE) => match &pending {
                Some((checked, _)) if *checked == image() => pending = None,
                _ => panic!("a stale re-check without its re-check: {}", line.raw),
            },
            REMOVED_MESSAGE | REMOVE_FAILED_MESSAGE => {
                let removal = removals
                    .last_mut()
                    .filter(|r| r.image == image())
                    .unwrap_or_else(|| panic!("a removal outcome without its removal: {}", line.raw));
                removal.done = Some(time());
                removal.outcome = if line.message == REMOVED_MESSAGE {
                    "removed"
                } else {
                    "failed"
                };
            }
            _ => {}
        }
    }
    removals
}
