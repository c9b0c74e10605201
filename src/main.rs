//! The `imagegc` binary: parse the command line, set up logging, run the
//! command on a current-thread runtime, and turn the result into an exit code.

// clippy.toml's rules (the wall clock, blocking sleeps) hold here.
#![warn(clippy::disallowed_methods)]

use std::process::ExitCode;

use clap::Parser;
use imagegc::cli::{Cli, CliError, Command, LogFormat};

fn main() -> ExitCode {
    // glibc keeps a freed block of up to 32 MiB in its heap, and raises the
    // size it maps anew each time one is freed: after a first cycle, the
    // listing's vectors and tables live in the heap, and what they leave
    // there when freed is never given back. A fixed threshold maps every
    // block of 1 MiB and more on its own and unmaps it when freed. (musl,
    // the release image's libc, maps large blocks on its own already.)
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of the allocator, before any
    // thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            // clap exits 2 for usage errors, 0 for --help and --version.
            return ExitCode::from(err.exit_code() as u8);
        }
    };
    if let Err(err) = init_logging(&cli) {
        eprintln!("imagegc: --log-level: {err}");
        return ExitCode::from(imagegc::cli::exit::CONFIG);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("imagegc: cannot start the async runtime: {err}");
            return ExitCode::from(imagegc::cli::exit::FAILED);
        }
    };
    let result = runtime.block_on(async {
        let config = imagegc::cli::load_config(&cli)?;
        match cli.command {
            Command::Run { .. } => imagegc::cli::run_daemon(&cli, config).await,
            _ => imagegc::cli::execute(&cli, config).await,
        }
    });
    // A configuration reload may still be blocked reading its file: leave
    // it behind rather than wait for it.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            report(&err);
            ExitCode::from(err.exit_code())
        }
    }
}

fn report(err: &CliError) {
    match err {
        // One line per problem, each already naming the file and the key.
        CliError::Config(config) => {
            for problem in &config.problems {
                eprintln!("{problem}");
            }
        }
        other => eprintln!("imagegc: {other}"),
    }
}

fn init_logging(cli: &Cli) -> Result<(), String> {
    let level = cli
        .log_level
        .clone()
        .unwrap_or_else(|| cli.command.default_log_level().to_string());
    let filter = imagegc::outputs::log::filter(&level)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    match cli.log_format {
        LogFormat::Json => builder.with_writer(std::io::stderr).json().flatten_event(true).init(),
        LogFormat::Text => builder
            .with_writer(imagegc::outputs::log::EscapingStderr)
            .with_ansi(false)
            .init(),
    }
    Ok(())
}
