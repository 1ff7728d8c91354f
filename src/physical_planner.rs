//! The physical planner of datafusion-grad's logical nodes: how what a
//! derivative *is* ([`crate::plan`]) becomes what runs ([`crate::exec`]).
//!
//! [`SharingPlanner`], the query planner installed by [`crate::register`],
//! is DataFusion's with our extension planners: [`Shared`] subplans
//! planned once per query into one cache ([`SharedExec`]), recursive
//! queries that read their work table more than once ([`Iterate`]) run by
//! [`IterateExec`], reverse mode through iterations ([`AdjointLoop`]) by
//! [`AdjointLoopExec`], an `UPDATE` of a table's own rows ([`Overwrite`])
//! by [`OverwriteExec`], and gradient tables ([`GroupJoin`]) by
//! [`GroupJoinExec`]; every recursive query's iterations are counted
//! against the session's bound ([`limit_iterations`]). The only module
//! that knows both layers, as DataFusion's own physical planner does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::{internal_err, DFSchemaRef};
use datafusion::datasource::source_as_provider;
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_plan::analyze::AnalyzeExec;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};

use crate::error::{fail, ErrorKind};
use crate::exec::adjoint_loop::{properties, AdjointLoopExec, Replay, Seeds};
use crate::exec::group_join::GroupJoinExec;
use crate::exec::history::{Checkpoints, HistoryExec, PreviousRowExec};
use crate::exec::iterate::IterateExec;
use crate::exec::iterations::limit_iterations;
use crate::exec::one_final_partition;
use crate::exec::overwrite::OverwriteExec;
use crate::exec::row_index::Duplicate;
use crate::exec::runs;
use crate::exec::shared::{Cache, SharedExec};
use crate::options::GradOptions;
use crate::plan::adjoint_loop::AdjointLoop;
use crate::plan::history::{History, PreviousRow};
use crate::plan::iterate::{iterate_loops, iterated, Iterate};
use crate::plan::overwrite::Overwrite;
use crate::plan::reverse::GroupJoin;
use crate::plan::shared::Shared;
use crate::reserved::{initial_column, seed_column, ITERATION_COLUMN, TRAJECTORY_COLUMN};

/// Plans [`Iterate`] nodes as [`IterateExec`]s.
#[derive(Debug, Default)]
pub struct IteratePlanner;

#[async_trait]
impl ExtensionPlanner for IteratePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(iterate) = node.as_any().downcast_ref::<Iterate>() else {
            return Ok(None);
        };
        let [static_term, recursive_term] = physical_inputs else {
            return internal_err!("Iterate has two inputs");
        };
        let schema = Arc::clone(iterate.schema.inner());
        let exec = IterateExec::try_new(
            &iterate.name,
            schema,
            Arc::clone(static_term),
            Arc::clone(recursive_term),
            iterate.distinct,
        )?;
        Ok(Some(Arc::new(exec)))
    }
}

/// The query planner installed by [`crate::register`]: DataFusion's, with
/// [`Shared`] nodes planned as [`SharedExec`]s, one cache per equal input
/// in each plan, and recursive queries that read their work table more
/// than once run by [`crate::plan::iterate`].
#[derive(Debug, Default)]
pub struct SharingPlanner;

#[async_trait]
impl QueryPlanner for SharingPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let caches = Arc::new(Caches::default());
        let plan = iterate_loops(logical_plan.clone())?;
        let plan = DefaultPhysicalPlanner::with_extension_planners(vec![
            caches,
            Arc::new(IteratePlanner),
            Arc::new(AdjointLoopPlanner),
            Arc::new(OverwritePlanner),
            Arc::new(GroupJoinPlanner),
            Arc::new(Histories::default()),
        ])
        .create_physical_plan(&plan, session)
        .await?;
        if let Some(analyzed) = plan.downcast_ref::<AnalyzeExec>() {
            runs::analyze(analyzed.input());
        }
        limit_iterations(plan)
    }
}

/// The shared subplans of one physical plan, by their logical plan: each
/// optimized and planned once, with its cache.
#[derive(Debug, Default)]
struct Caches(Mutex<HashMap<LogicalPlan, Planned>>);

/// A shared subplan, planned, and its cache.
type Planned = (Arc<dyn ExecutionPlan>, Arc<Cache>);

#[async_trait]
impl ExtensionPlanner for Caches {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        _physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(shared) = node.as_any().downcast_ref::<Shared>() else {
            return Ok(None);
        };
        let known = self
            .0
            .lock()
            .expect("caches lock")
            .get(&shared.input)
            .cloned();
        let (input, cache) = match known {
            Some(known) => known,
            None => {
                // Planned with `planner`, so that the shared subplans in it
                // are planned into these caches too.
                let optimized = iterate_loops(session.optimize(&shared.input)?)?;
                let input = planner.create_physical_plan(&optimized, session).await?;
                let mut caches = self.0.lock().expect("caches lock");
                let entry = caches
                    .entry(shared.input.as_ref().clone())
                    .or_insert_with(|| (input, Arc::default()));
                (Arc::clone(&entry.0), Arc::clone(&entry.1))
            }
        };
        Ok(Some(Arc::new(SharedExec::new(input, cache))))
    }
}

/// Plans the [`History`] and [`PreviousRow`] nodes of each loop over one
/// record of its [`Checkpoints`] (per physical plan, by the loop's logical
/// plan); the loop is planned anew for each read (as DataFusion runs it)
/// and for the replays (run by our iteration), so that no two of them
/// iterate one plan at once.
#[derive(Debug, Default)]
struct Histories(Mutex<HashMap<LogicalPlan, Arc<Checkpoints>>>);

impl Histories {
    /// The checkpoints of the loop `lp`.
    async fn of(
        &self,
        lp: &LogicalPlan,
        planner: &dyn PhysicalPlanner,
        session: &dyn Session,
    ) -> Result<Arc<Checkpoints>> {
        if let Some(known) = self.0.lock().expect("histories lock").get(lp) {
            return Ok(Arc::clone(known));
        }
        let every = GradOptions::setting(session.config_options(), |o| o.checkpoint_every);
        let replay = match every {
            1 => None,
            _ => Some(loop_plan(lp, true, planner, session).await?),
        };
        let schema = Arc::clone(lp.schema().inner());
        let iteration = schema.index_of(ITERATION_COLUMN)?;
        let checkpoints = Arc::new(Checkpoints::new(replay, every, schema, iteration));
        let mut known = self.0.lock().expect("histories lock");
        Ok(Arc::clone(known.entry(lp.clone()).or_insert(checkpoints)))
    }
}

/// The loop `lp` optimized and planned; with `replays`, run by our
/// iteration (which replays an iteration from given rows).
async fn loop_plan(
    lp: &LogicalPlan,
    replays: bool,
    planner: &dyn PhysicalPlanner,
    session: &dyn Session,
) -> Result<Arc<dyn ExecutionPlan>> {
    let optimized = iterate_loops(session.optimize(lp)?)?;
    let optimized = match replays {
        true => iterated(optimized)?,
        false => optimized,
    };
    planner.create_physical_plan(&optimized, session).await
}

#[async_trait]
impl ExtensionPlanner for Histories {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(history) = node.as_any().downcast_ref::<History>() {
            let checkpoints = self.of(&history.input, planner, session).await?;
            let input = loop_plan(&history.input, false, planner, session).await?;
            return Ok(Some(Arc::new(HistoryExec::new(input, checkpoints))));
        }
        let Some(previous) = node.as_any().downcast_ref::<PreviousRow>() else {
            return Ok(None);
        };
        let [input] = physical_inputs else {
            return internal_err!("PreviousRow has one input");
        };
        let checkpoints = self.of(&previous.history, planner, session).await?;
        let rows = input.schema();
        let at = [
            rows.index_of(TRAJECTORY_COLUMN)?,
            rows.index_of(ITERATION_COLUMN)?,
        ];
        let trajectory = previous
            .history
            .schema()
            .inner()
            .index_of(TRAJECTORY_COLUMN)?;
        let exec = PreviousRowExec::try_new(
            Arc::clone(input),
            checkpoints,
            at,
            trajectory,
            Arc::clone(previous.schema.inner()),
        )?;
        Ok(Some(Arc::new(exec)))
    }
}

/// Plans [`AdjointLoop`] nodes as [`AdjointLoopExec`]s.
#[derive(Debug, Default)]
pub struct AdjointLoopPlanner;

#[async_trait]
impl ExtensionPlanner for AdjointLoopPlanner {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<AdjointLoop>() else {
            return Ok(None);
        };
        let [input] = physical_inputs else {
            return internal_err!("AdjointLoop has one input");
        };
        let step = &node.step;
        let physical = |exprs: &[Expr], schema: &DFSchemaRef| {
            exprs
                .iter()
                .map(|e| planner.create_physical_expr(e, schema, session, planning_ctx))
                .collect::<Result<Vec<_>>>()
        };
        let input_schema = input.schema();
        let at = |name: &str| input_schema.index_of(name).map_err(Into::into);
        let mut wanted = Vec::new();
        for (k, w) in node.wanted.iter().enumerate() {
            let mut seeds = Vec::new();
            for (i, &c) in step.differentiable.iter().enumerate() {
                seeds.push(match w.seeded[i] {
                    true => Some(at(&seed_column(k, c))?),
                    false => None,
                });
            }
            wanted.push(Seeds {
                seeds,
                copies: w.copies.clone(),
            });
        }
        let exec = AdjointLoopExec {
            input: Arc::clone(input),
            schema: Arc::clone(node.schema.inner()),
            name: step.name.clone(),
            replay: Arc::new(Replay {
                state: Arc::clone(step.state.inner()),
                updates: physical(&step.updates, &step.state)?,
                differentiable: step.differentiable.clone(),
                adjoint_schema: Arc::clone(step.adjoint_schema.inner()),
                adjoints: physical(&step.adjoints, &step.adjoint_schema)?,
            }),
            iteration: at(ITERATION_COLUMN)?,
            initial: (0..step.state.fields().len())
                .map(|c| at(&initial_column(c)))
                .collect::<Result<_>>()?,
            wanted,
            properties: properties(node.schema.inner(), input),
        };
        Ok(Some(Arc::new(exec)))
    }
}

/// Plans [`Overwrite`] nodes as [`OverwriteExec`]s.
#[derive(Debug, Default)]
pub struct OverwritePlanner;

#[async_trait]
impl ExtensionPlanner for OverwritePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<Overwrite>() else {
            return Ok(None);
        };
        let [input] = physical_inputs else {
            return internal_err!("Overwrite has one input");
        };
        let table = source_as_provider(&node.target)?;
        if !table.is::<MemTable>() {
            return fail(
                ErrorKind::NeedsPlanContext,
                format!(
                    "UPDATE {} with a derivative with respect to the table's rows replaces its \
                     contents, which datafusion-grad does for in-memory tables only; write the \
                     step as `CREATE OR REPLACE TABLE … AS SELECT` instead",
                    node.table_name
                ),
            );
        }
        let schema: SchemaRef = Arc::new(node.schema.as_arrow().clone());
        Ok(Some(Arc::new(OverwriteExec {
            properties: one_final_partition(&schema),
            input: Arc::clone(input),
            table,
            schema,
        })))
    }
}

/// Plans [`GroupJoin`] nodes as [`GroupJoinExec`]s.
#[derive(Debug, Default)]
pub struct GroupJoinPlanner;

#[async_trait]
impl ExtensionPlanner for GroupJoinPlanner {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<GroupJoin>() else {
            return Ok(None);
        };
        let keep = match (&node.keep, logical_inputs.first()) {
            (Some(keep), Some(rows)) => {
                Some(planner.create_physical_expr(keep, rows.schema(), session, planning_ctx)?)
            }
            _ => None,
        };
        let [rows, contributions, scaled @ ..] = physical_inputs else {
            return internal_err!("GroupJoin has two inputs or more");
        };
        let schema: SchemaRef = Arc::new(node.schema.as_arrow().clone());
        Ok(Some(Arc::new(GroupJoinExec {
            properties: one_final_partition(&schema),
            rows: Arc::clone(rows),
            contributions: Arc::clone(contributions),
            scaled: scaled.to_vec(),
            duplicate: {
                let check = node.check();
                Arc::new(Duplicate {
                    kind: check.kind(),
                    message: check.message(),
                })
            },
            identity: node.identity.clone(),
            keep,
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
        })))
    }
}
