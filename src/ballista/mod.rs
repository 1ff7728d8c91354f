//! Gradient queries on an [Apache Ballista] 55 cluster (cargo feature
//! `ballista`).
//!
//! The differentiation runs on the client: DataFusion hands Ballista's query
//! planner the *optimized* logical plan, in which `grad`, `jvp` and `vjp` have
//! already rewritten themselves (simplify and the analyzer rule run in the
//! client's session). What travels to the scheduler is plain DataFusion plus
//! the functions of ours that stay in plans (the tensor functions and
//! aggregates, `differentiate_sql`), which Ballista sends by name: the
//! scheduler and every executor must know them, so they run
//! [`dfgrad-scheduler` / `dfgrad-executor`](cluster), or Ballista's own
//! processes built with [`session_state`], [`function_registry`] and our
//! physical codec ([`codec::GradPhysicalCodec`], which ships the operator
//! that keeps a loop's data on the executors).
//!
//! Recursive CTEs: Ballista 55 cannot run them (DataFusion's physical plan
//! protobuf has no `RecursiveQueryExec`/`WorkTableExec`), so the client drives
//! their iterations ([`recursion`]): a gradient-descent training loop written
//! as `WITH RECURSIVE` runs each step as a distributed query, and the
//! executors keep the loop's data (a file scan, its filters and projections)
//! across the steps ([`kept`]).
//!
//! ```no_run
//! # async fn example() -> datafusion::error::Result<()> {
//! let ctx = datafusion_grad::ballista::remote("df://127.0.0.1:50050").await?;
//! ctx.sql("SELECT grad(avg((w * x - y) * (w * x - y)), w) FROM 'points.parquet' CROSS JOIN (VALUES (0.5)) p(w) GROUP BY w")
//!     .await?
//!     .show()
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! [Apache Ballista]: https://datafusion.apache.org/ballista/

pub mod cluster;
pub mod codec;
pub mod deadline;
pub mod keep;
pub mod kept;
pub mod recursion;

use std::sync::Arc;

use ballista::prelude::SessionContextExt;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::BallistaCodec;
use ballista_scheduler::scheduler_server::SessionBuilder;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::execution::FunctionRegistry;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::exec::broadcast_aggregate::BroadcastAggregate;
use crate::options::GradOptions;
use crate::plan::analyzer::with_rewrite_rules;
use datafusion::physical_optimizer::PhysicalOptimizerRule;

/// The configuration of every Ballista session of ours (client, scheduler,
/// executors): Ballista's settings plus the `datafusion_grad` ones, and
/// DataFusion's file-scan work stealing off, so that each task reads the files the
/// scheduler planned for its partitions: DataFusion's documentation of
/// `datafusion.execution.enable_file_stream_work_stealing` asks this of
/// executors that run partitions as separate tasks, and Ballista 55 leaves
/// it on. Plans travel with our physical codec ([`codec::GradPhysicalCodec`]).
pub fn config() -> SessionConfig {
    let mut config = SessionConfig::new_with_ballista()
        .with_option_extension(GradOptions::default())
        .with_ballista_physical_extension_codec(Arc::new(codec::GradPhysicalCodec::default()));
    config
        .options_mut()
        .execution
        .enable_file_stream_work_stealing = false;
    config
}

/// A session state for a scheduler: Ballista's default state for `config`
/// (its planner settings and optimizer rules) with DataFusion's and our
/// functions, so plans that use them decode, our analyzer rule, and the
/// physical rules of [`scheduling`]: the broadcast aggregation in each
/// partition and the rule that keeps loop-invariant data on the executors
/// ([`keep::KeepOnExecutors`]). Use it as a Ballista
/// `SchedulerConfig::override_session_builder`.
pub fn session_state(config: SessionConfig) -> Result<SessionState> {
    // Plans arrive from clients with their markers rewritten; the rewrite
    // rules are there for SQL planned in this state, where a marker left
    // to its own simplify would differentiate an aggregate's output column
    // as a constant (0).
    let state = with_rewrite_rules(ballista_core::utils::default_session_builder(config)?);
    let mut state = scheduling(state);
    add_functions(&crate::session_context().state(), &mut state)?;
    Ok(state)
}

/// `state` with the physical optimizer rules of ours that a scheduler runs
/// last: the broadcast aggregation as distributed stages need it
/// ([`BroadcastAggregate::distributed`], in place of the local one), the
/// contractions ([`crate::Contraction`]: a partial aggregate and its join,
/// within one stage), then [`keep::KeepOnExecutors`].
fn scheduling(state: SessionState) -> SessionState {
    let local = BroadcastAggregate::default();
    let mut rules: Vec<_> = state
        .physical_optimizers()
        .iter()
        .filter(|rule| rule.name() != local.name())
        .cloned()
        .collect();
    rules.push(Arc::new(BroadcastAggregate::distributed()));
    rules.push(Arc::new(crate::Contraction));
    rules.push(Arc::new(keep::KeepOnExecutors));
    SessionStateBuilder::new_from_existing(state)
        .with_physical_optimizer_rules(rules)
        .build()
}

/// Registers every scalar, aggregate and window function of `from` in `to`.
fn add_functions(from: &SessionState, to: &mut SessionState) -> Result<()> {
    for f in from.scalar_functions().values() {
        to.register_udf(Arc::clone(f))?;
    }
    for f in from.aggregate_functions().values() {
        to.register_udaf(Arc::clone(f))?;
    }
    for f in from.window_functions().values() {
        to.register_udwf(Arc::clone(f))?;
    }
    Ok(())
}

/// The functions an executor resolves plan functions by: DataFusion's
/// (nested ones included) and ours. Use it as a Ballista
/// `ExecutorProcessConfig::override_function_registry`.
pub fn function_registry() -> Result<BallistaFunctionRegistry> {
    Ok(BallistaFunctionRegistry::from(&session_state(config())?))
}

/// A client session of a Ballista cluster's scheduler at `url`
/// (`df://host:port`), with everything of ours installed.
pub async fn remote(url: &str) -> Result<SessionContext> {
    let local = crate::session_context_with_config(config());
    let ctx = SessionContext::remote_with_state(url, local.state()).await?;
    client(&local, &ctx)
}

/// A session of an in-process Ballista cluster (a scheduler and an
/// executor started in this process, on loopback), with everything of ours
/// installed — for tests and for trying Ballista out.
///
/// Unlike Ballista's `standalone_with_state`, whose scheduler plans every
/// query in the state it was started with, the scheduler plans each query
/// with the client's settings of that query (as a remote scheduler does).
pub async fn standalone() -> Result<SessionContext> {
    let local = crate::session_context_with_config(config());
    let state = scheduling(local.state());
    let builder: SessionBuilder = {
        let state = state.clone();
        Arc::new(move |config: SessionConfig| {
            Ok(SessionStateBuilder::new_from_existing(state.clone())
                .with_config(config)
                .build())
        })
    };
    let codec = BallistaCodec::new(
        state.config().ballista_logical_extension_codec(),
        state.config().ballista_physical_extension_codec(),
    );
    let address = ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        builder,
        Arc::new(config),
        codec,
    )
    .await
    .map_err(cluster::ballista_error)?;
    let url = format!("http://localhost:{}", address.port());
    // the scheduler answers within 30 s
    let mut tries = 0;
    let scheduler = loop {
        match SchedulerGrpcClient::connect(url.clone()).await {
            Ok(scheduler) => break scheduler,
            Err(e) if tries == 300 => {
                return Err(DataFusionError::External(Box::new(e))
                    .context(format!("the in-process scheduler at {url}")));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
        tries += 1;
    };
    let vcores = state.config().ballista_standalone_parallelism();
    ballista_executor::new_standalone_executor_from_state(scheduler, vcores, &state)
        .await
        .map_err(cluster::ballista_error)?;
    let url = format!("df://localhost:{}", address.port());
    let ctx = SessionContext::remote_with_state(&url, local.state()).await?;
    client(&local, &ctx)
}

/// `ctx` (a Ballista client made from `local`'s state) with `local`'s
/// functions put back — Ballista's upgrade of a session state replaces its
/// function lists with Ballista's own — and with recursive queries driven by
/// the client ([`recursion::ClientRecursion`]).
fn client(local: &SessionContext, ctx: &SessionContext) -> Result<SessionContext> {
    let state = ctx.state();
    let planner = Arc::new(recursion::ClientRecursion::new(Arc::clone(
        state.query_planner(),
    )));
    let mut state = SessionStateBuilder::new_from_existing(state)
        .with_query_planner(planner)
        .build();
    add_functions(&local.state(), &mut state)?;
    Ok(SessionContext::new_with_state(state))
}
