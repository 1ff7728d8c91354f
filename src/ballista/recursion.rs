//! Recursive CTEs on Ballista, driven by the client.
//!
//! Ballista 55 cannot run `WITH RECURSIVE`: DataFusion's physical plan
//! protobuf has no `RecursiveQueryExec` or `WorkTableExec`, so the scheduler
//! fails to ship such a stage. [`ClientRecursion`] wraps Ballista's query
//! planner and evaluates each recursive query the way `RecursiveQueryExec`
//! does, one distributed query per iteration:
//!
//! 1. run the static term;
//! 2. run the recursive term with its work-table scans replaced by the rows
//!    of the previous iteration, written into the plan as `VALUES`;
//! 3. stop when an iteration returns no rows (for `UNION`, no rows not seen
//!    before);
//!
//! and then plans the query around it with the accumulated rows as `VALUES`.
//! So a gradient-descent loop written as one recursive query runs each step
//! on the cluster. A derivative through the recursion in reverse mode (an
//! `AdjointLoop`) replays the iterations of its rows on the client, its
//! input run on the cluster. The work table travels inside each plan: this suits work
//! tables of model parameters (a few rows per step), not recursive queries
//! that produce millions of rows. The queries of one recursive query's
//! iterations carry a key of its run (`datafusion_grad.ballista_loop_run`),
//! under which the executors keep the loop's data across them
//! ([`super::kept`]). A recursive query inside a subquery expression is
//! sent as it is (and refused by Ballista).
//!
//! Every query the client runs is bounded in time ([`DeadlineExec`]).

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ballista_core::config::BALLISTA_ADAPTIVE_PLANNER_ENABLED;
use datafusion::arrow::array::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, DFSchemaRef, ScalarValue};
use datafusion::datasource::cte_worktable::CteWorkTable;
use datafusion::datasource::source_as_provider;
use datafusion::error::Result;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{col, lit, Expr, LogicalPlan, LogicalPlanBuilder, TableScan};
use datafusion::physical_plan::{collect, ExecutionPlan};
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

use super::deadline::DeadlineExec;
use crate::error::{fail, ErrorKind};
use crate::exec::iterate::Seen;
use crate::exec::iterations::IterationLimit;
use crate::options::GradOptions;
use crate::physical_planner::AdjointLoopPlanner;
use crate::plan::adjoint_loop::AdjointLoop;
use crate::reserved::BACKWARD_ROWS;

/// A query planner that evaluates recursive queries on the client, one
/// query of `inner` (Ballista's planner) per iteration, and plans the rest
/// with `inner`.
#[derive(Debug)]
pub struct ClientRecursion {
    inner: Arc<dyn QueryPlanner + Send + Sync>,
}

impl ClientRecursion {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn QueryPlanner + Send + Sync>) -> Self {
        Self { inner }
    }

    /// `plan` with each recursive query replaced by its rows.
    async fn unroll(&self, plan: &LogicalPlan, session: &dyn Session) -> Result<LogicalPlan> {
        let inputs = plan.inputs();
        let mut unrolled = Vec::with_capacity(inputs.len());
        for input in inputs {
            unrolled.push(Box::pin(self.unroll(input, session)).await?);
        }
        let plan = plan.with_new_exprs(plan.expressions(), unrolled)?;
        match &plan {
            LogicalPlan::RecursiveQuery(q) => {
                let rows = self.iterate(q, session).await?;
                rows_plan(&rows, q.schema.clone(), None)
            }
            LogicalPlan::Extension(e) if e.node.as_any().is::<AdjointLoop>() => {
                self.replay(&plan, session).await
            }
            _ => Ok(plan),
        }
    }

    /// The rows of `plan`, an [`AdjointLoop`] (reverse mode through a
    /// recursive query, which Ballista does not know): its input run on the
    /// cluster, the iterations replayed here.
    async fn replay(&self, plan: &LogicalPlan, session: &dyn Session) -> Result<LogicalPlan> {
        let [input] = plan.inputs()[..] else {
            unreachable!("an AdjointLoop has one input")
        };
        let rows = self.run(input, session).await?;
        let here = plan.with_new_exprs(
            vec![],
            vec![rows_plan(&rows, Arc::clone(input.schema()), None)?],
        )?;
        let exec =
            DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(AdjointLoopPlanner)])
                .create_physical_plan(&here, session)
                .await?;
        let rows = collect(exec, session.task_ctx()).await?;
        rows_plan(&rows, Arc::clone(plan.schema()), None)
    }

    /// The rows of the recursive query `q`, computed iteration by iteration.
    async fn iterate(
        &self,
        q: &datafusion::logical_expr::RecursiveQuery,
        session: &dyn Session,
    ) -> Result<Vec<RecordBatch>> {
        let mut seen = q
            .is_distinct
            .then(|| Seen::new(q.schema.inner()))
            .transpose()?;
        let mut work = self.run(&q.static_term, session).await?;
        if let Some(seen) = seen.as_mut() {
            work = work
                .iter()
                .map(|b| seen.new_rows(b))
                .collect::<Result<_>>()?;
        }
        let mut all = work.clone();
        let limit = IterationLimit::from_options(session.config_options());
        let run = looping(session, &run_key())?;
        let mut iteration = 0;
        while work.iter().any(|b| b.num_rows() > 0) {
            let term = with_work_table(&q.recursive_term, &q.name, &work)?;
            let exec = self.plan(&term, session).await?;
            work = collect(exec, Arc::clone(&run)).await?;
            if let Some(seen) = seen.as_mut() {
                work = work
                    .iter()
                    .map(|b| seen.new_rows(b))
                    .collect::<Result<_>>()?;
            }
            iteration += 1;
            if work.iter().any(|b| b.num_rows() > 0) {
                limit.check(iteration)?;
            }
            all.extend(work.iter().cloned());
        }
        Ok(all)
    }

    /// Runs `plan` on the cluster.
    async fn run(&self, plan: &LogicalPlan, session: &dyn Session) -> Result<Vec<RecordBatch>> {
        let exec = self.plan(plan, session).await?;
        collect(exec, session.task_ctx()).await
    }

    /// `inner`'s physical plan of `plan`, bounded in time
    /// ([`DeadlineExec`]).
    async fn plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let exec = self.inner.create_physical_plan(plan, session).await?;
        let seconds = session
            .config_options()
            .extensions
            .get::<GradOptions>()
            .map_or(GradOptions::default().ballista_timeout_seconds, |o| {
                o.ballista_timeout_seconds
            });
        Ok(DeadlineExec::wrap(exec, seconds))
    }
}

#[async_trait]
impl QueryPlanner for ClientRecursion {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // Ballista does not know the shared-subplan node (each read is
        // computed) nor a loop's checkpointed rows (the loop and a join) nor
        // the group join of a gradient table (plain operators) nor, on its
        // executors, its duplicate-rows check (plain SQL).
        let logical_plan = &crate::plan::reverse::plain_checks(
            crate::plan::reverse::plain_group_joins(crate::plan::history::plain_histories(
                crate::plan::shared::unshare(logical_plan.clone())?,
            )?)?,
        )?;
        refuse_backward_rows(logical_plan)?;
        let recursive = logical_plan.exists(|p| Ok(matches!(p, LogicalPlan::RecursiveQuery(_))))?;
        if matches!(logical_plan, LogicalPlan::Explain(_)) {
            return self.inner.create_physical_plan(logical_plan, session).await;
        }
        if !recursive {
            return self.plan(logical_plan, session).await;
        }
        let plan = self.unroll(logical_plan, session).await?;
        self.plan(&plan, session).await
    }
}

/// Refuses relational reverse mode through a loop whose step reads its
/// work table again ([`BACKWARD_ROWS`], a loop nested in the recursive
/// term of another, reading its history): not run by this client.
fn refuse_backward_rows(plan: &LogicalPlan) -> Result<()> {
    let mut found = false;
    plan.apply_with_subqueries(|p| {
        found |= matches!(p, LogicalPlan::RecursiveQuery(q) if q.name == BACKWARD_ROWS);
        Ok(TreeNodeRecursion::Continue)
    })?;
    match found {
        true => fail(
            ErrorKind::NeedsPlanContext,
            "on Ballista, relational reverse mode through a loop whose step reads its work \
             table again (the loop run backwards, reading the forward loop's history) is not \
             run; run the query in a local session",
        ),
        false => Ok(()),
    }
}

/// A key for one run of a recursive query, unique across the clients of a
/// cluster (64 random bits and a count of this process's runs).
fn run_key() -> String {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let random = RandomState::new().build_hasher().finish();
    let count = RUNS.fetch_add(1, Ordering::Relaxed);
    format!("{random:016x}-{count}")
}

/// The task context of `session` for the queries of the iterations of run
/// `run`: planned by Ballista's static planner, whose rules are the
/// scheduler session's — the broadcast aggregation and
/// [`super::keep::KeepOnExecutors`] among them — where its adaptive planner
/// optimizes with a fixed list of rules of its own; and with
/// `datafusion_grad.ballista_loop_run` set (unless `cache_loop_invariants`
/// is off), so that the executors keep the loop's data ([`super::kept`]).
fn looping(session: &dyn Session, run: &str) -> Result<Arc<TaskContext>> {
    let mut config = session.config().clone();
    let options = config.options_mut();
    options.set(BALLISTA_ADAPTIVE_PLANNER_ENABLED, "false")?;
    if let Some(grad) = options.extensions.get_mut::<GradOptions>() {
        if grad.cache_loop_invariants {
            grad.ballista_loop_run = run.to_string();
        }
    }
    let task = session.task_ctx();
    Ok(Arc::new(TaskContext::new(
        task.task_id(),
        task.session_id(),
        config,
        task.scalar_functions().clone(),
        task.higher_order_functions().clone(),
        task.aggregate_functions().clone(),
        task.window_functions().clone(),
        task.runtime_env(),
    )))
}

/// `term` with every scan of the work table `name` reading `rows`.
fn with_work_table(term: &LogicalPlan, name: &str, rows: &[RecordBatch]) -> Result<LogicalPlan> {
    term.clone()
        .transform_up(|p| match &p {
            LogicalPlan::TableScan(scan) if is_work_table(scan, name) => {
                let schema = scan.source.schema();
                let full = DFSchema::try_from_qualified_schema(scan.table_name.clone(), &schema)?;
                let plan = rows_plan(rows, Arc::new(full), Some(scan))?;
                Ok(Transformed::yes(plan))
            }
            _ => Ok(Transformed::no(p)),
        })
        .map(|t| t.data)
}

fn is_work_table(scan: &TableScan, name: &str) -> bool {
    scan.table_name.table() == name
        && source_as_provider(&scan.source)
            .is_ok_and(|p| p.downcast_ref::<CteWorkTable>().is_some())
}

/// A plan that produces `rows` with the column names of `schema`: `VALUES`
/// (Ballista ships its literals; a `VALUES` plan's own column names are not
/// shipped, so a projection renames them), aliased to `scan`'s table and
/// with its projection, filters and limit where it replaces a work-table
/// scan. No rows: one row of typed NULLs, filtered out.
fn rows_plan(
    rows: &[RecordBatch],
    schema: DFSchemaRef,
    scan: Option<&TableScan>,
) -> Result<LogicalPlan> {
    let mut values = Vec::new();
    for batch in rows {
        for row in 0..batch.num_rows() {
            values.push(
                batch
                    .columns()
                    .iter()
                    .map(|c| ScalarValue::try_from_array(c, row).map(lit))
                    .collect::<Result<Vec<Expr>>>()?,
            );
        }
    }
    let empty = values.is_empty();
    if empty {
        values.push(
            schema
                .fields()
                .iter()
                .map(|f| ScalarValue::try_from(f.data_type()).map(lit))
                .collect::<Result<Vec<Expr>>>()?,
        );
    }
    let names = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| col(format!("column{}", i + 1)).alias(f.name()));
    let mut plan = LogicalPlanBuilder::values(values)?.project(names)?;
    if empty {
        plan = plan.filter(lit(false))?;
    }
    let Some(scan) = scan else {
        // In place of a recursive query: its columns keep their qualifiers.
        let exprs = schema
            .iter()
            .map(|(q, f)| {
                let c = Expr::Column(Column::new_unqualified(f.name()));
                match q {
                    Some(q) => c.alias_qualified(Some(q.clone()), f.name()),
                    None => c.alias(f.name()),
                }
            })
            .collect::<Vec<_>>();
        return plan.project(exprs)?.build();
    };
    let mut plan = plan.alias(scan.table_name.clone())?;
    if let Some(projection) = &scan.projection {
        let fields = scan.source.schema();
        plan = plan.project(projection.iter().map(|i| {
            Expr::Column(Column::new(
                Some(scan.table_name.clone()),
                fields.field(*i).name(),
            ))
        }))?;
    }
    for f in &scan.filters {
        plan = plan.filter(f.clone())?;
    }
    if let Some(fetch) = scan.fetch {
        plan = plan.limit(0, Some(fetch))?;
    }
    plan.build()
}
