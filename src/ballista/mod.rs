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
//! processes built with [`session_state`] and [`function_registry`].
//!
//! Recursive CTEs: Ballista 55 cannot run them (DataFusion's physical plan
//! protobuf has no `RecursiveQueryExec`/`WorkTableExec`), so the client drives
//! their iterations ([`recursion`]): a gradient-descent training loop written
//! as `WITH RECURSIVE` runs each step as a distributed query.
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
pub mod deadline;
pub mod recursion;

use std::sync::Arc;

use ballista::prelude::SessionContextExt;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use datafusion::error::Result;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::execution::FunctionRegistry;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::options::GradOptions;

/// The configuration of every Ballista session of ours (client, scheduler,
/// executors): Ballista's settings plus the `datafusion_grad` ones, with the
/// broadcast aggregation off (Ballista cannot ship `BroadcastAggregateExec`;
/// its planner does not run our physical rules anyway), and DataFusion's
/// file-scan work stealing off, so that each task reads the files the
/// scheduler planned for its partitions: DataFusion's documentation of
/// `datafusion.execution.enable_file_stream_work_stealing` asks this of
/// executors that run partitions as separate tasks, and Ballista 55 leaves
/// it on.
pub fn config() -> SessionConfig {
    let options = GradOptions {
        broadcast_aggregate: false,
        ..GradOptions::default()
    };
    let mut config = SessionConfig::new_with_ballista().with_option_extension(options);
    config
        .options_mut()
        .execution
        .enable_file_stream_work_stealing = false;
    config
}

/// A session state for a scheduler: Ballista's default state for `config`
/// (its planner settings and optimizer rules) with DataFusion's and our
/// functions, so plans that use them decode. Use it as a Ballista
/// `SchedulerConfig::override_session_builder`.
pub fn session_state(config: SessionConfig) -> Result<SessionState> {
    let mut state = ballista_core::utils::default_session_builder(config)?;
    add_functions(&crate::session_context().state(), &mut state)?;
    Ok(state)
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
pub async fn standalone() -> Result<SessionContext> {
    let local = crate::session_context_with_config(config());
    let ctx = SessionContext::standalone_with_state(local.state()).await?;
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
