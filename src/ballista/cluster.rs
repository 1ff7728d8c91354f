//! Ballista scheduler and executor processes that know our functions (the
//! `dfgrad-scheduler` and `dfgrad-executor` binaries).
//!
//! Both are Ballista's own processes, configured with Ballista's
//! `SchedulerConfig` / `ExecutorProcessConfig`; [`scheduler_config`] and
//! [`executor_config`] add what datafusion-grad needs: sessions (scheduler)
//! and a function registry (executors) with DataFusion's and our functions,
//! the `datafusion_grad` settings, so a query's `SET
//! datafusion_grad.tensor_device` applies on the executors too, and our
//! physical codec ([`super::codec`]), so the operators that keep a loop's
//! data on the executors travel to them.

use std::net::SocketAddr;
use std::sync::Arc;

use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::error::{DataFusionError, Result};

use super::codec::GradPhysicalCodec;

/// `config` with our sessions and settings (a scheduler decodes each query's
/// plan in a session made by its session builder).
pub fn scheduler_config(config: SchedulerConfig) -> SchedulerConfig {
    SchedulerConfig {
        override_config_producer: Some(Arc::new(super::config)),
        override_session_builder: Some(Arc::new(super::session_state)),
        override_physical_codec: Some(Arc::new(GradPhysicalCodec::default())),
        ..config
    }
}

/// `config` with our functions and settings (an executor resolves a task's
/// functions by name in its registry).
pub fn executor_config(config: ExecutorProcessConfig) -> Result<ExecutorProcessConfig> {
    Ok(ExecutorProcessConfig {
        override_function_registry: Some(Arc::new(super::function_registry()?)),
        override_config_producer: Some(Arc::new(super::config)),
        override_physical_codec: Some(Arc::new(GradPhysicalCodec::default())),
        ..config
    })
}

/// Runs a scheduler with `config` ([`scheduler_config`] applied) until it
/// stops.
pub async fn run_scheduler(config: SchedulerConfig) -> Result<()> {
    let config = scheduler_config(config);
    let address: SocketAddr = format!("{}:{}", config.bind_host, config.bind_port)
        .parse()
        .map_err(|e| {
            DataFusionError::Configuration(format!(
                "scheduler address {}:{}: {e}",
                config.bind_host, config.bind_port
            ))
        })?;
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(ballista_error)?;
    start_server(cluster, address, Arc::new(config))
        .await
        .map_err(ballista_error)
}

/// Runs an executor with `config` ([`executor_config`] applied) until it
/// stops (on SIGINT/SIGTERM, or when its scheduler tells it to).
pub async fn run_executor(config: ExecutorProcessConfig) -> Result<()> {
    start_executor_process(Arc::new(executor_config(config)?))
        .await
        .map_err(ballista_error)
}

/// A Ballista error as DataFusion's.
pub(super) fn ballista_error(e: ballista_core::error::BallistaError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}
