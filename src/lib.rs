//! # datafusion-grad: differentiable SQL on Apache DataFusion
//!
//! `grad(f, x)`, `jvp(f, x, t)` and `vjp(f, x, u)` are SQL functions that
//! rewrite themselves into their derivative while DataFusion plans the query,
//! so they work in every query shape: recursive CTEs (a whole gradient descent
//! in one query), DML, views, subqueries, and the DataFrame API.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> datafusion::error::Result<()> {
//! let ctx = datafusion_grad::session_context();
//! let batches = ctx
//!     .sql("SELECT grad(x * x * y, x) AS d FROM (VALUES (3.0, 2.0)) AS t(x, y)")
//!     .await?
//!     .collect()
//!     .await?;
//! let d = batches[0].column(0).as_any()
//!     .downcast_ref::<datafusion::arrow::array::Float64Array>().unwrap();
//! assert_eq!(d.value(0), 12.0); // 2·x·y
//! # Ok(())
//! # }
//! ```
//!
//! # Architecture
//!
//! Layers run one way, each using only those above it in this list:
//!
//! | layer | modules | what it is |
//! |---|---|---|
//! | foundation | [`error`], `reserved`, [`options`] | typed errors, the reserved `__dfgrad…` names, settings |
//! | primitives | [`tensor`], [`rules`] | tensor kernels and functions; the derivative rule of each primitive (a table, like JAX's jvp registry) |
//! | engine | [`engine`] | differentiates one expression over a hash-consed DAG, reverse or forward mode, shared parts bound once |
//! | plan, exec | [`plan`], [`exec`] | what a derivative *is*: the analyzer rule, the rewrites that need plan context (aggregates, subqueries, derived columns, free variables, DML, relational reverse mode, recursion) and our logical nodes; how it *runs*: our operators and physical rules (broadcast aggregates, contractions, loop-invariant data, shared subplans, loops, the adjoint replay, gradient tables). Neither uses the other |
//! | physical planning | [`physical_planner`] | our logical nodes planned as our operators: the one module that knows both |
//! | frontends | [`marker`], [`table_factor`], [`export`], `substrait` (feature) | the SQL functions, `grad(loss, tbl.col)` in FROM, SQL text export, Substrait |
//! | installation | this crate root: [`register`], [`session_context`] | everything installed into a `SessionContext` |
//! | on top | `ballista` (feature), [`cli`] (the `dfgrad` binary's shell), the Python package | distributed execution, the CLI, Python |
//!
//! Errors are typed ([`GradError`], [`ErrorKind`]).

// foundation
pub mod error;
pub mod options;
// pub for the tests in tests/unit/reserved.rs, plan_free_variables.rs and
// plan_lineage.rs
#[doc(hidden)]
pub mod reserved;

// primitives
pub mod rules;
pub mod tensor;

// engine
pub mod engine;

// what a derivative is, and how it runs
pub mod exec;
pub mod plan;

// our logical nodes planned as our operators
pub mod physical_planner;

// frontends
#[cfg(feature = "ballista")]
pub mod ballista;
pub mod export;
pub mod marker;
#[cfg(feature = "substrait")]
pub mod substrait;
pub mod table_factor;

// on top
pub mod cli;

use std::sync::{Arc, RwLock};

use datafusion::error::Result;
use datafusion::execution::context::SessionConfig;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionContext;

pub use error::{ErrorKind, GradError};
pub use plan::bindings::inline_common_subexpressions;
pub use plan::scans::widen_scans;
pub use rules::{Call, DerivativeRule, Partial, Rules};

use engine::call::{Marker, MarkerKind, SharedRules};
pub use exec::broadcast_aggregate::BroadcastAggregate;
pub use exec::contraction::Contraction;
pub use exec::loop_invariant::LoopInvariants;
pub use exec::serial_iterations::SerialIterations;
pub use exec::step_projections::StepProjections;
pub use plan::analyzer::{GradAnalyzer, GradBeforeOptimizing};
pub use plan::dml::InlineUpdates;

/// Installs `grad`, `jvp`, `vjp`, `differentiate_sql`, the tensor functions
/// ([`tensor`]), the analyzer rule, the planner rules ([`plan::dml`],
/// [`exec::broadcast_aggregate`], [`exec::contraction`], [`exec::loop_invariant`],
/// [`exec::serial_iterations`], [`exec::step_projections`]) and the query
/// planner of our logical nodes ([`physical_planner`]) into `ctx`, with the built-in derivative rules. The
/// query planner replaces `ctx`'s: DataFusion's default planner, plus the
/// shared subplans.
pub fn register(ctx: &SessionContext) {
    register_with_rules(ctx, Rules::builtin());
}

/// Installs everything into `ctx` with a custom rule table.
pub fn register_with_rules(ctx: &SessionContext, rules: Rules) {
    let rules: SharedRules = Arc::new(RwLock::new(rules));
    for kind in MarkerKind::ALL {
        ctx.register_udf(ScalarUDF::new_from_impl(Marker::new(
            kind,
            Arc::clone(&rules),
        )));
    }
    ctx.register_udf(ScalarUDF::new_from_impl(
        export::function::DifferentiateSql::default(),
    ));
    tensor::register(ctx);
    options::register(ctx);
    ctx.register_relation_planner(Arc::new(table_factor::GradRelation::new(
        ctx.state().catalog_list().clone(),
    )))
    .expect("a relation planner registers");
    ctx.add_optimizer_rule(Arc::new(InlineUpdates));
    let state = ctx.state_ref();
    let mut state = state.write();
    *state =
        SessionStateBuilder::new_from_existing(plan::analyzer::with_rewrite_rules(state.clone()))
            .with_physical_optimizer_rule(Arc::new(Contraction))
            .with_physical_optimizer_rule(Arc::new(LoopInvariants))
            .with_physical_optimizer_rule(Arc::new(BroadcastAggregate::default()))
            .with_physical_optimizer_rule(Arc::new(SerialIterations))
            .with_physical_optimizer_rule(Arc::new(StepProjections))
            .with_query_planner(Arc::new(physical_planner::SharingPlanner))
            .build();
}

/// A new [`SessionContext`] with everything installed.
pub fn session_context() -> SessionContext {
    session_context_with_config(SessionConfig::new())
}

/// A new [`SessionContext`] with `config` and everything installed.
pub fn session_context_with_config(config: SessionConfig) -> SessionContext {
    let ctx = SessionContext::new_with_config(config);
    register(&ctx);
    ctx
}

/// Adds a derivative rule for the function `name` (e.g. your own scalar UDF)
/// to the rules used by `ctx`'s markers — the equivalent of JAX's `custom_jvp`.
///
/// ```
/// use datafusion::prelude::*;
/// use datafusion_grad::{Call, Partial};
///
/// let ctx = datafusion_grad::session_context();
/// // d/du sin(u) written by hand (replacing the built-in rule)
/// datafusion_grad::register_rule(&ctx, "sin", |c: &Call| Ok(vec![Partial::Value(cos(c.arg(0)))]))
///     .unwrap();
/// ```
pub fn register_rule(
    ctx: &SessionContext,
    name: &str,
    rule: impl DerivativeRule + 'static,
) -> Result<()> {
    let udf = ctx.udf("grad")?;
    let marker = udf
        .inner()
        .downcast_ref::<Marker>()
        .ok_or_else(|| GradError::new(ErrorKind::InvalidWrt, "grad is not datafusion-grad's"))?;
    marker
        .rules()
        .write()
        .expect("rule table lock")
        .insert(name, rule);
    Ok(())
}
