//! `dfgrad-executor`: a Ballista executor that knows datafusion-grad's
//! functions (cargo feature `ballista`); see `dfgrad-scheduler`.

use std::process::ExitCode;

use ballista_executor::executor_process::ExecutorProcessConfig;
use clap::Parser;

/// A Ballista executor with datafusion-grad's functions.
#[derive(Parser, Debug)]
#[command(name = "dfgrad-executor", version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_host: String,
    /// Host name the scheduler and other executors reach this one by.
    #[arg(long, default_value = "127.0.0.1")]
    external_host: String,
    /// Port of the Arrow Flight service (shuffle data).
    #[arg(long, default_value_t = 50051)]
    bind_port: u16,
    /// Port of the gRPC service the scheduler pushes tasks to.
    #[arg(long, default_value_t = 50052)]
    bind_grpc_port: u16,
    /// The scheduler's host.
    #[arg(long, default_value = "127.0.0.1")]
    scheduler_host: String,
    /// The scheduler's port.
    #[arg(long, default_value_t = 50050)]
    scheduler_port: u16,
    /// Seconds to keep trying to reach the scheduler at start (0: once).
    #[arg(long, default_value_t = 30)]
    scheduler_connect_timeout_seconds: u16,
    /// Tasks run at once (default: the number of cores).
    #[arg(long)]
    concurrent_tasks: Option<usize>,
    /// Directory for shuffle files (default: a temporary directory).
    #[arg(long)]
    work_dir: Option<String>,
    /// Seconds between heartbeats to the scheduler.
    #[arg(long, default_value_t = 60)]
    heartbeat_interval_seconds: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let defaults = ExecutorProcessConfig::default();
    let config = ExecutorProcessConfig {
        bind_host: args.bind_host,
        external_host: Some(args.external_host),
        port: args.bind_port,
        grpc_port: args.bind_grpc_port,
        scheduler_host: args.scheduler_host,
        scheduler_port: args.scheduler_port,
        scheduler_connect_timeout_seconds: args.scheduler_connect_timeout_seconds,
        vcores: args.concurrent_tasks.unwrap_or(defaults.vcores),
        work_dir: args.work_dir,
        executor_heartbeat_interval_seconds: args.heartbeat_interval_seconds,
        ..defaults
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(32 * 1024 * 1024)
        .build()
        .expect("tokio runtime");
    match runtime.block_on(datafusion_grad::ballista::cluster::run_executor(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dfgrad-executor: {e}");
            ExitCode::FAILURE
        }
    }
}
