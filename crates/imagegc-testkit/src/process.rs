//! An `imagegc run` child stopped the way a node stops a daemon: SIGTERM,
//! then a bounded wait for its exit. The daemon, end-to-end and chaos
//! tests each keep their own log and say what they expected of the exit.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// A child process (`imagegc run`), killed and reaped when dropped if it
/// is still running.
#[derive(Debug)]
pub struct Running(Child);

impl Running {
    /// Owns `child` from now on.
    pub fn new(child: Child) -> Self {
        Running(child)
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }

    /// Sends `signal` to the child.
    ///
    /// # Panics
    /// When kill(2) fails (the child was already reaped).
    pub fn signal(&self, signal: i32) {
        let pid = libc::pid_t::try_from(self.0.id()).expect("a pid fits a pid_t");
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}): {}", std::io::Error::last_os_error());
    }

    /// Sends SIGTERM (unless the child already exited) and waits up to
    /// `within` for the exit: its status and how long it took; past
    /// `within`, the child is killed and reaped, and `Err` says how long it
    /// was given.
    pub fn terminate(&mut self, within: Duration) -> Result<(ExitStatus, Duration), Duration> {
        let started = Instant::now();
        if let Ok(Some(status)) = self.0.try_wait() {
            return Ok((status, Duration::ZERO));
        }
        self.signal(libc::SIGTERM);
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Ok((status, started.elapsed()));
            }
            if started.elapsed() > within {
                let _ = self.0.kill();
                let _ = self.0.wait();
                return Err(within);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The exit status, once the process exited within `within`; `None`
    /// while it still runs then.
    pub async fn exited_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_ends_on_sigterm_is_waited_for_and_one_that_ignores_it_is_killed() {
        let mut sleeper = Running::new(std::process::Command::new("sleep").arg("30").spawn().unwrap());
        let (status, took) = sleeper.terminate(Duration::from_secs(10)).unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGTERM)
        );
        assert!(took < Duration::from_secs(10));
        let mut stubborn = std::process::Command::new("sleep");
        stubborn.arg("30");
        // SAFETY: signal(2) is async-signal-safe; an ignored signal stays
        // ignored across exec, so `sleep` ignores SIGTERM from its start.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut stubborn, || {
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
                Ok(())
            });
        }
        let mut stubborn = Running::new(stubborn.spawn().unwrap());
        assert_eq!(
            stubborn.terminate(Duration::from_millis(300)),
            Err(Duration::from_millis(300))
        );
        assert!(stubborn.0.try_wait().unwrap().is_some(), "killed and reaped");
    }

    #[test]
    fn a_running_child_is_killed_when_dropped() {
        let running = Running::new(std::process::Command::new("sleep").arg("30").spawn().unwrap());
        let pid = libc::pid_t::try_from(running.0.id()).unwrap();
        drop(running);
        // SAFETY: signal 0 only asks whether the pid exists.
        assert_eq!(unsafe { libc::kill(pid, 0) }, -1, "killed and reaped");
    }
}
