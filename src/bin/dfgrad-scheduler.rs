//! `dfgrad-scheduler`: a Ballista scheduler that knows datafusion-grad's
//! functions (cargo feature `ballista`).
//!
//! ```text
//! dfgrad-scheduler --bind-port 50050
//! dfgrad-executor --scheduler-port 50050 --bind-port 50051 --bind-grpc-port 50052
//! dfgrad --ballista df://127.0.0.1:50050 -f examples/train.sql
//! ```

use std::process::ExitCode;

use ballista_scheduler::config::SchedulerConfig;
use clap::Parser;

/// A Ballista scheduler with datafusion-grad's functions.
#[derive(Parser, Debug)]
#[command(name = "dfgrad-scheduler", version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_host: String,
    /// Port of the scheduler's gRPC service (what clients connect to, as
    /// `df://HOST:PORT`).
    #[arg(long, default_value_t = 50050)]
    bind_port: u16,
    /// Host name executors and clients reach this scheduler by.
    #[arg(long, default_value = "127.0.0.1")]
    external_host: String,
    /// Seconds without a heartbeat after which an executor is lost (its
    /// tasks run again elsewhere).
    #[arg(long, default_value_t = 180)]
    executor_timeout_seconds: u64,
    /// Seconds between checks for lost executors.
    #[arg(long, default_value_t = 15)]
    expire_dead_executor_interval_seconds: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = SchedulerConfig {
        bind_host: args.bind_host,
        bind_port: args.bind_port,
        external_host: args.external_host,
        executor_timeout_seconds: args.executor_timeout_seconds,
        expire_dead_executor_interval_seconds: args.expire_dead_executor_interval_seconds,
        no_executors_grace_period_seconds: args.executor_timeout_seconds,
        ..SchedulerConfig::default()
    };
    // Ballista's own scheduler runs with large stacks (deep plans).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(32 * 1024 * 1024)
        .build()
        .expect("tokio runtime");
    match runtime.block_on(datafusion_grad::ballista::cluster::run_scheduler(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dfgrad-scheduler: {e}");
            ExitCode::FAILURE
        }
    }
}
