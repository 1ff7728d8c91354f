//! Contractions: sums of products over an inner equijoin, grouped by columns
//! of its two sides, computed without the joined rows.
//!
//! A matrix product written relationally,
//!
//! ```sql
//! SELECT x.n, w.h, sum(x.v * w.val) FROM x JOIN w ON x.d = w.d GROUP BY x.n, w.h
//! ```
//!
//! is planned by DataFusion as a hash join whose output — N·D·H rows for
//! an N×D and a D×H matrix — a hash aggregate groups into N·H groups: the
//! joined rows are built, their group keys hashed, one row at a time.
//! [`Contraction`] replaces the partial aggregate and its join by
//! [`ContractionExec`], which numbers the join keys and the group keys of
//! each side once, lists each build row under its key (its group and its
//! factor of every product), and for each probe row adds its factor times
//! each listed factor straight into the sums of the groups they make (side
//! by side where the build side has few groups, like a row of a dense
//! product; where a key's list is one entry per build group, in order,
//! and nothing is NULL, as one multiply-add over the row's sums; where
//! every such list's factors are finite and there is one sum, the rows'
//! factors are laid out as a matrix and multiplied with the build side's
//! on the tensor kernels' GEMM: `gemm.rs`, counted as `gemm_rows` in
//! `EXPLAIN ANALYZE`). The final aggregate above merges its partial sums
//! as before, or, where the probe side gives group columns, the operator
//! replaces it too: its probe rows hashed by those columns, each group is
//! summed in one partition, and its sums are final (`mode=Final` in
//! `EXPLAIN`; `merged.rs`). In one partition (`target_partitions = 1`),
//! where DataFusion aggregates in one step (`mode=Single`), the operator
//! replaces that aggregate whole, in final mode, whichever side gives the
//! group columns. `EXPLAIN ANALYZE` shows the time spent listing
//! the build side as `build_time` (`elapsed_compute` is the probe side's).
//!
//! The answer is the join + aggregate's: a group exists only where a joined
//! row does; NULL keys match nothing (or, under `IS NOT DISTINCT FROM`,
//! each other); a row counts as often as it occurs; a product with a NULL
//! factor is not added, and a group no non-NULL product reached sums to
//! NULL. Only what these rules cover is replaced —
//! an inner hash join without a filter, keys and group columns of integer
//! or string types (SQL equality is their encoding's), `GROUP BY` columns
//! or expressions of one side's columns (not volatile) without grouping
//! sets, and every aggregate a `sum` of a `Float64`
//! product whose factors each read one side (or none) — and anything else
//! (a `FILTER`, `DISTINCT`, float or decimal keys, another aggregate) stays
//! the join + aggregate. Under memory pressure the operator emits its
//! partial sums early, as DataFusion's partial aggregate does (in final
//! mode, to a final aggregate of DataFusion's that merges them with the
//! rest's); where the groups are nearly the probe rows (DataFusion's
//! `skip_partial_aggregation_probe_*` settings) and the build side gives
//! no group column, it gives each probe row's sums as its own group, for
//! the final aggregate to merge (not in final mode). Where the probe rows are themselves an
//! inner join, the operator may take that join's inputs instead (a
//! chain: `chain.rs`). In a recursive term, loop-invariant collected sides
//! (a training loop's data) are listed once for all iterations
//! ([`ContractionExec::kept`]). Off with `SET datafusion_grad.contraction =
//! false`.

mod chain;
mod gemm;
mod merged;
// pub for the tests in tests/unit/exec_contraction_groups.rs
#[doc(hidden)]
pub mod groups;
// pub for the tests in tests/unit/exec_contraction_numbering.rs
#[doc(hidden)]
pub mod numbering;

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use datafusion::arrow::compute::{concat_batches, take};
use datafusion::arrow::datatypes::{DataType, Float64Type, SchemaRef};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, DataFusionError, JoinType, NullEquality};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::is_volatile;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, Time,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    InputDistributionRequirements, Partitioning, PlanProperties, SendableRecordBatchStream,
};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::kept_join::read_once;
use super::loop_invariant::is_invariant;
use super::{at_join, dealt, kit};
use crate::options::GradOptions;
use chain::Near;
use gemm::DenseProduct;
use groups::{Emitted, Groups};
use numbering::{Nulls, Numbering, NONE};

/// The physical optimizer rule that installs [`ContractionExec`]
/// (registered by [`crate::register`] and on Ballista's scheduler; runs
/// after DataFusion's rules; off with `SET datafusion_grad.contraction =
/// false`).
#[derive(Debug, Default)]
pub struct Contraction;

impl PhysicalOptimizerRule for Contraction {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let enabled = GradOptions::setting(config, |o| o.contraction);
        if !enabled {
            return Ok(plan);
        }
        let plan = plan
            .transform_up(|node| {
                Ok(match ContractionExec::try_from_plan(&node)? {
                    Some(exec) => Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>),
                    None => Transformed::no(node),
                })
            })
            .data()?;
        merged::finals(plan)
    }

    fn name(&self) -> &str {
        "contraction"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The join's two inputs: the build side, listed under its keys, and the
/// probe side, streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Build,
    Probe,
}

/// One side's part of the contraction: expressions over that side's rows.
#[derive(Debug, Clone)]
struct Part {
    /// The join keys.
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The group columns this side gives.
    groups: Vec<Arc<dyn PhysicalExpr>>,
    /// Each aggregate's factor from this side (`None`: 1).
    factors: Vec<Option<Arc<dyn PhysicalExpr>>>,
}

impl Part {
    /// The part's columns of `batch`: its keys, its group columns and its
    /// factors (`None`: 1).
    fn evaluate(&self, batch: &RecordBatch) -> Result<Evaluated> {
        let rows = batch.num_rows();
        let factors = self
            .factors
            .iter()
            .map(|f| match f {
                Some(f) => Ok(Some(
                    f.evaluate(batch)?
                        .into_array(rows)?
                        .as_primitive::<Float64Type>()
                        .clone(),
                )),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Evaluated {
            rows,
            keys: evaluate_all(&self.keys, batch)?,
            groups: evaluate_all(&self.groups, batch)?,
            factors,
        })
    }

    /// The part with each of its expressions `e` replaced by `by(e)`.
    fn map(
        self,
        by: impl Fn(Arc<dyn PhysicalExpr>) -> Result<Arc<dyn PhysicalExpr>>,
    ) -> Result<Self> {
        Ok(Self {
            keys: self.keys.into_iter().map(&by).collect::<Result<_>>()?,
            groups: self.groups.into_iter().map(&by).collect::<Result<_>>()?,
            factors: (self.factors.into_iter())
                .map(|f| f.map(&by).transpose())
                .collect::<Result<_>>()?,
        })
    }

    /// A numbering of this side's group columns (`None`: it gives none, all
    /// its rows are group 0).
    fn group_numbering(&self, schema: &SchemaRef) -> Result<Option<Numbering>> {
        if self.groups.is_empty() {
            return Ok(None);
        }
        let types = self
            .groups
            .iter()
            .map(|g| g.data_type(schema))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Numbering::new(&types, Nulls::Grouped)?))
    }
}

/// The columns of `exprs` over `batch`.
fn evaluate_all(exprs: &[Arc<dyn PhysicalExpr>], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    (exprs.iter())
        .map(|e| e.evaluate(batch)?.into_array(batch.num_rows()))
        .collect()
}

/// A side's columns of one batch.
struct Evaluated {
    rows: usize,
    keys: Vec<ArrayRef>,
    groups: Vec<ArrayRef>,
    factors: Vec<Option<Float64Array>>,
}

/// What every partition of a [`ContractionExec`] computes, apart from its
/// inputs.
#[derive(Debug, Clone)]
struct Spec {
    /// The partial aggregate it replaces, down to the join (in final mode,
    /// the final aggregate over it).
    replaced: Arc<dyn ExecutionPlan>,
    build: Part,
    probe: Part,
    /// Each output group column: the side it comes from, and its place
    /// among that side's group columns.
    group_order: Vec<(Side, usize)>,
    /// Whether NULL join keys match each other (`IS NOT DISTINCT FROM`)
    /// or nothing.
    nulls: Nulls,
    /// The partial sums' schema: the group columns, then each sum.
    schema: SchemaRef,
    /// A chain's third input, the near side (`None`: two inputs).
    near: Option<Near>,
    /// In final mode, the final aggregate it replaces too (`None`: it
    /// gives partial sums).
    merged: Option<merged::Merged>,
}

impl Spec {
    /// The schema of the operator's output.
    fn output_schema(&self) -> &SchemaRef {
        match &self.merged {
            Some(m) => &m.schema,
            None => &self.schema,
        }
    }
}

/// The build side, listed under its keys.
#[derive(Debug)]
struct Build {
    keys: Numbering,
    groups: Option<Numbering>,
    /// The entries of key number `k` are `starts[k]..starts[k + 1]`.
    starts: Vec<usize>,
    /// In a chain, each entry's link number, ascending within a key's
    /// entries (empty otherwise).
    link: Vec<u32>,
    /// Each entry's build group number.
    group: Vec<u32>,
    /// Each entry's factor of every aggregate (`aggregates` per entry;
    /// 1 where the side has none).
    factor: Vec<f64>,
    /// Whether each of those factors is not NULL (empty: none is NULL).
    valid: Vec<bool>,
    /// Whether the entries of each key are, in order, one for each number
    /// of what they are listed by (the link in a chain, else the build
    /// group; never an empty list): a row of a dense matrix, whose
    /// products a probe row adds side by side.
    dense: Vec<bool>,
    /// The build side as a dense matrix for a GEMM, where it is one
    /// ([`gemm::matrix`]); made once, for every output partition.
    matrix: Option<gemm::Matrix>,
    memory: MemoryReservation,
}

/// The collected inputs: the build side, and in a chain the near side.
#[derive(Debug)]
struct Collected {
    build: Build,
    near: Option<Build>,
}

type SharedBuild =
    Shared<BoxFuture<'static, std::result::Result<Arc<Collected>, Arc<DataFusionError>>>>;

/// A partial `sum`-of-products aggregate over an inner hash join, computed
/// without the joined rows (see the [module docs](self)).
#[derive(Debug)]
pub struct ContractionExec {
    spec: Arc<Spec>,
    /// The build side (one partition).
    left: Arc<dyn ExecutionPlan>,
    /// In a chain, the near side (one partition).
    near: Option<Arc<dyn ExecutionPlan>>,
    /// The probe side.
    right: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    /// The collected build side of the current execution (reset by
    /// `reset_state`), or of every execution where [`Self::kept`].
    collected: Arc<Mutex<Option<SharedBuild>>>,
    /// Whether the collected sides are loop-invariant sides of a recursive
    /// term, collected once for all its iterations (see [`Self::kept`]).
    kept: bool,
    metrics: ExecutionPlanMetricsSet,
}

impl ContractionExec {
    /// `Some` when `plan` is a partial aggregate over a join this operator
    /// can replace.
    fn try_from_plan(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Self>> {
        let Some(pair) = Self::pair(plan)? else {
            return Ok(None);
        };
        if let Some(chain) = chain::chained(&pair, &pair.properties.partitioning)? {
            return Ok(Some(chain));
        }
        Ok(Some(chain::swapped(&pair)?.unwrap_or(pair)))
    }

    /// `Some` when `plan` is a partial aggregate over a join this operator
    /// can replace, as a contraction of two inputs.
    fn pair(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Self>> {
        let Some(aggregate) = plan.downcast_ref::<AggregateExec>() else {
            return Ok(None);
        };
        let group_by = aggregate.group_expr();
        let plain = *aggregate.mode() == AggregateMode::Partial
            && group_by.is_single()
            && !group_by.expr().is_empty()
            && aggregate.filter_expr().iter().all(Option::is_none)
            && aggregate.limit_options().is_none()
            && aggregate.aggr_expr().iter().all(|a| float_sum(a));
        let schema = aggregate.schema();
        if !plain || schema.fields().len() != group_by.expr().len() + aggregate.aggr_expr().len() {
            return Ok(None);
        }
        // The group keys, then each sum's argument, followed down to the join.
        let mut exprs: Vec<Arc<dyn PhysicalExpr>> =
            group_by.expr().iter().map(|(e, _)| Arc::clone(e)).collect();
        exprs.extend(
            aggregate
                .aggr_expr()
                .iter()
                .map(|a| Arc::clone(&a.expressions()[0])),
        );
        let mut input = aggregate.input();
        loop {
            if let Some(projection) = input.downcast_ref::<ProjectionExec>() {
                exprs = (exprs.into_iter())
                    .map(|e| beneath(projection, e))
                    .collect::<Result<_>>()?;
                input = projection.input();
            } else if let Some(deal) = dealt(input) {
                // The joined rows dealt over the partitions: the probe rows
                // are dealt instead (the same partial sums, per partition).
                let partitions = deal.partitioning().partition_count();
                return match collecting(plan, partitions)? {
                    Some(plan) => Self::pair(&plan),
                    None => Ok(None),
                };
            } else {
                break;
            }
        }
        let Some(join) = input.downcast_ref::<HashJoinExec>() else {
            return Ok(None);
        };
        if !plain_inner(join) {
            return Ok(None);
        }
        if *join.partition_mode() == PartitionMode::Partitioned {
            // Co-partitioned inputs: the build side is collected instead,
            // and the probe rows stay where they are (not hashed by key).
            let partitions = join.properties().partitioning.partition_count();
            return match collecting(plan, partitions)? {
                Some(plan) => Self::pair(&plan),
                None => Ok(None),
            };
        }
        let join_schema = Arc::clone(join.join_schema());
        exprs = (exprs.into_iter())
            .map(|e| unprojected(join, e))
            .collect::<Result<_>>()?;
        let (left, right) = (join.left(), join.right());
        let width = left.schema().fields().len();
        let (left_schema, right_schema) = (left.schema(), right.schema());
        let keys_supported = join.on().iter().all(|(l, r)| {
            let types = (l.data_type(&left_schema), r.data_type(&right_schema));
            matches!(types, (Ok(a), Ok(b)) if a == b && numbering::supported(&a))
        });
        if !keys_supported {
            return Ok(None);
        }
        let mut build = Part {
            keys: join.on().iter().map(|(l, _)| Arc::clone(l)).collect(),
            groups: vec![],
            factors: vec![],
        };
        let mut probe = Part {
            keys: join.on().iter().map(|(_, r)| Arc::clone(r)).collect(),
            groups: vec![],
            factors: vec![],
        };
        let groups = group_by.expr().len();
        let mut group_order = vec![];
        for e in &exprs[..groups] {
            // A column, or an expression over one side's columns (a key
            // `h.j + 1` that a backward pass groups by).
            let Some((side, true)) = side_and_columns(e, width) else {
                return Ok(None);
            };
            if !numbering::supported(&e.data_type(&join_schema)?) {
                return Ok(None);
            }
            let part = match side {
                Side::Build => &mut build,
                Side::Probe => &mut probe,
            };
            group_order.push((side, part.groups.len()));
            part.groups
                .push(substitute(Arc::clone(e), |c| local(c, width).1)?);
        }
        for e in &exprs[groups..] {
            let Some((b, p)) = split_product(e, &join_schema, width)? else {
                return Ok(None);
            };
            build.factors.push(b);
            probe.factors.push(p);
        }
        let spec = Spec {
            replaced: Arc::clone(plan),
            build,
            probe,
            group_order,
            nulls: nulls(join.null_equality()),
            schema,
            near: None,
            merged: None,
        };
        Ok(Some(Self::new(
            Arc::new(spec),
            Arc::clone(left),
            None,
            Arc::clone(right),
            Arc::clone(aggregate.properties()),
        )))
    }

    fn new(
        spec: Arc<Spec>,
        left: Arc<dyn ExecutionPlan>,
        near: Option<Arc<dyn ExecutionPlan>>,
        right: Arc<dyn ExecutionPlan>,
        properties: Arc<PlanProperties>,
    ) -> Self {
        Self {
            spec,
            left,
            near,
            right,
            properties,
            collected: Arc::default(),
            kept: false,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The operator with its collected sides (the build side, and in a
    /// chain the near side) collected once for every iteration of the
    /// recursive term it is in, as a [`KeptHashJoinExec`] keeps its table:
    /// where they are loop-invariant and the probe side is not. The
    /// `LoopInvariantExec` over such a side is dropped (the listing keeps
    /// what it needs of the rows). `None` where it does not qualify.
    ///
    /// [`KeptHashJoinExec`]: crate::exec::kept_join::KeptHashJoinExec
    pub(crate) fn kept(&self) -> Result<Option<Self>> {
        let qualifies = |exec: &Self| {
            let mut collected = std::iter::once(&exec.left).chain(&exec.near);
            collected.all(is_invariant) && !is_invariant(&exec.right)
        };
        if self.kept || !qualifies(self) {
            return Ok(None);
        }
        let mut inputs: Vec<_> = std::iter::once(&self.left)
            .chain(&self.near)
            .map(read_once)
            .collect();
        inputs.push(Arc::clone(&self.right));
        let mut exec = Self::from_replaced(Arc::clone(&self.spec.replaced), inputs)?;
        if !qualifies(&exec) {
            return Ok(None);
        }
        exec.kept = true;
        Ok(Some(exec))
    }

    /// `exec` (a copy of this operator) sharing this one's collected
    /// sides where they are kept.
    fn sharing(&self, mut exec: Self) -> Self {
        if self.kept {
            exec.kept = true;
            exec.collected = Arc::clone(&self.collected);
        }
        exec
    }

    /// The aggregate and join(s) this operator replaces, over `inputs` (as
    /// its children: the build side, the near side of a chain, the probe
    /// side): with [`Self::from_replaced`], how it is rebuilt over new
    /// inputs and how it travels to Ballista's executors
    /// (`crate::ballista::codec`).
    pub fn replaced(&self, inputs: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        at_joins(Arc::clone(&self.spec.replaced), inputs)
    }

    /// The operator for `replaced` (a plan of [`Self::replaced`]) over
    /// `inputs`.
    pub fn from_replaced(
        replaced: Arc<dyn ExecutionPlan>,
        mut inputs: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Self> {
        if merged::is_final(&replaced) {
            // The probe rows as the partial sums had them (a chain checks
            // that its partitioning is kept): hashed by their group columns
            // again below.
            if let Some(probe) = inputs.pop() {
                inputs.push(unrepartitioned(&probe));
            }
            let plan = at_joins(replaced, inputs)?;
            return match merged::finalized(&plan)? {
                Some(exec) => Ok(exec),
                None => internal_err!("not a contraction's final sums: {}", plan.name()),
            };
        }
        let plan = at_joins(replaced, inputs)?;
        match Self::try_from_plan(&plan)? {
            Some(exec) => Ok(exec),
            None => internal_err!("not a contraction: {}", plan.name()),
        }
    }

    /// The build side (and a chain's near side), collected once for all
    /// output partitions.
    fn build(&self, context: &Arc<TaskContext>) -> SharedBuild {
        let mut slot = self.collected.lock().expect("build side lock");
        slot.get_or_insert_with(|| {
            let time = MetricBuilder::new(&self.metrics).subset_time("build_time", 0);
            let (build, near) = (Arc::clone(&self.left), self.near.clone());
            let spec = Arc::clone(&self.spec);
            let context = Arc::clone(context);
            async move {
                let Some(chain) = &spec.near else {
                    let without = Links::Without;
                    let build =
                        Build::collect(build, &spec.build, spec.nulls, without, &context, &time)
                            .await?;
                    return Ok(Arc::new(Collected { build, near: None }));
                };
                let Some(near) = near else {
                    return internal_err!("a chained ContractionExec without its near side");
                };
                let schema = build.schema();
                let types = (chain.build_links.iter())
                    .map(|l| l.data_type(&schema))
                    .collect::<Result<Vec<_>>>()?;
                let mut links = Numbering::new(&types, spec.nulls)?;
                let numbered = Links::Numbered(&chain.build_links, &mut links);
                let build =
                    Build::collect(build, &spec.build, spec.nulls, numbered, &context, &time)
                        .await?;
                links.freeze();
                let found = Links::Found(&chain.links, &links);
                let near =
                    Build::collect(near, &chain.part, chain.nulls, found, &context, &time).await?;
                Ok(Arc::new(Collected {
                    build,
                    near: Some(near),
                }))
            }
            .map(|r| r.map_err(Arc::new))
            .boxed()
            .shared()
        })
        .clone()
    }
}

/// The NULL rule of join keys under `equality`.
fn nulls(equality: NullEquality) -> Nulls {
    match equality {
        NullEquality::NullEqualsNothing => Nulls::Unmatched,
        NullEquality::NullEqualsNull => Nulls::Grouped,
    }
}

/// `plan` with `inputs` as the inputs of its joins: the build and probe
/// side of its first hash join, or in a chain (three inputs) the build
/// side of the first and the near and probe sides of the hash join below
/// its probe side.
fn at_joins(
    plan: Arc<dyn ExecutionPlan>,
    inputs: Vec<Arc<dyn ExecutionPlan>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    match <[_; 3]>::try_from(inputs) {
        Ok([build, near, probe]) => {
            let mut below = None;
            plan.apply(|node| {
                Ok(match node.downcast_ref::<HashJoinExec>() {
                    Some(join) => {
                        below = Some(Arc::clone(join.right()));
                        TreeNodeRecursion::Stop
                    }
                    None => TreeNodeRecursion::Continue,
                })
            })?;
            let Some(below) = below else {
                return internal_err!("a chained contraction without its joins");
            };
            let probe = at_join::<HashJoinExec>(below, near, probe)?;
            at_join::<HashJoinExec>(plan, build, probe)
        }
        Err(inputs) => match <[_; 2]>::try_from(inputs) {
            Ok([build, probe]) => at_join::<HashJoinExec>(plan, build, probe),
            Err(inputs) => internal_err!("a contraction over {} inputs", inputs.len()),
        },
    }
}

/// Whether `join` is an inner equijoin without a filter whose inputs a
/// contraction can take (collected, or co-partitioned).
fn plain_inner(join: &HashJoinExec) -> bool {
    *join.join_type() == JoinType::Inner
        && join.filter().is_none()
        && !join.null_aware
        && join.fetch().is_none()
        && matches!(
            join.partition_mode(),
            PartitionMode::CollectLeft | PartitionMode::Partitioned
        )
}

/// `expr` over `projection`'s output as an expression over its input.
fn beneath(
    projection: &ProjectionExec,
    expr: Arc<dyn PhysicalExpr>,
) -> Result<Arc<dyn PhysicalExpr>> {
    let below = projection.expr();
    substitute(expr, |c| Arc::clone(&below[c.index()].expr))
}

/// `expr` over `join`'s output as an expression over its joined rows
/// (before its projection).
fn unprojected(join: &HashJoinExec, expr: Arc<dyn PhysicalExpr>) -> Result<Arc<dyn PhysicalExpr>> {
    let Some(projection) = &join.projection else {
        return Ok(expr);
    };
    let schema = join.join_schema();
    substitute(expr, |c| {
        let at = projection[c.index()];
        Arc::new(Column::new(schema.field(at).name(), at))
    })
}

/// `plan` with its first hash join collecting its build side (the join
/// mode `CollectLeft`, the build rows in one partition), its probe rows in
/// at least `partitions` partitions, dealt where they are fewer instead of
/// hashed by key, and no round-robin repartition between its aggregate and
/// the join. `None` where no hash join lies below.
fn collecting(
    plan: &Arc<dyn ExecutionPlan>,
    partitions: usize,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let mut joined = false;
    let plan = Arc::clone(plan)
        .transform_down(|node| {
            let (node, removed) = match dealt(&node) {
                Some(deal) => (Arc::clone(deal.input()), true),
                None => (node, false),
            };
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::new_transformed(node, removed));
            };
            joined = true;
            let build = unrepartitioned(join.left());
            let build = match build.output_partitioning().partition_count() {
                1 => build,
                _ => Arc::new(CoalescePartitionsExec::new(build)),
            };
            let probe = unrepartitioned(join.right());
            let probe = match probe.output_partitioning().partition_count() < partitions {
                true => Arc::new(RepartitionExec::try_new(
                    probe,
                    Partitioning::RoundRobinBatch(partitions),
                )?) as Arc<dyn ExecutionPlan>,
                false => probe,
            };
            let join = join
                .builder()
                .with_partition_mode(PartitionMode::CollectLeft)
                .with_new_children(vec![build, probe])?
                .recompute_properties()
                .build_exec()?;
            Ok(Transformed::new(join, true, TreeNodeRecursion::Jump))
        })
        .data()?;
    Ok(joined.then_some(plan))
}

/// `plan` without the repartitions (by hash or round-robin) on top of it.
fn unrepartitioned(plan: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let mut plan = Arc::clone(plan);
    while let Some(r) = plan.downcast_ref::<RepartitionExec>() {
        if r.preserve_order() {
            break;
        }
        plan = Arc::clone(r.input());
    }
    plan
}

/// Whether `a` is a `sum` this operator computes: of one `Float64`
/// argument, its partial state one `Float64` sum.
fn float_sum(a: &AggregateFunctionExpr) -> bool {
    let state = a.state_fields();
    a.fun().name() == "sum"
        && !a.is_distinct()
        && a.order_bys().is_empty()
        && a.expressions().len() == 1
        && a.field().data_type() == &DataType::Float64
        && matches!(state.as_deref(), Ok([s]) if s.data_type() == &DataType::Float64)
}

/// `expr` with every column `c` replaced by `by(c)`.
fn substitute(
    expr: Arc<dyn PhysicalExpr>,
    by: impl Fn(&Column) -> Arc<dyn PhysicalExpr>,
) -> Result<Arc<dyn PhysicalExpr>> {
    expr.transform(|e| {
        Ok(match e.downcast_ref::<Column>() {
            Some(c) => Transformed::yes(by(c)),
            None => Transformed::no(e),
        })
    })
    .data()
}

/// The side of the join output's column `c` (the build side's columns
/// come first, `width` of them), and the column in that side's rows.
fn local(c: &Column, width: usize) -> (Side, Arc<dyn PhysicalExpr>) {
    match c.index() < width {
        true => (Side::Build, Arc::new(Column::new(c.name(), c.index()))),
        false => (
            Side::Probe,
            Arc::new(Column::new(c.name(), c.index() - width)),
        ),
    }
}

/// The side of the join output whose columns `expr` reads (the build
/// side's come first, `width` of them), the build side where it reads
/// none; `None` where it reads both, or is volatile (its value is one
/// per joined row, not one per row of a side).
fn side_of(expr: &Arc<dyn PhysicalExpr>, width: usize) -> Option<Side> {
    side_and_columns(expr, width).map(|(side, _)| side)
}

/// [`side_of`] `expr`, and whether it reads any column.
fn side_and_columns(expr: &Arc<dyn PhysicalExpr>, width: usize) -> Option<(Side, bool)> {
    if is_volatile(expr) {
        return None;
    }
    let columns = collect_columns(expr);
    let reads = !columns.is_empty();
    match (
        columns.iter().all(|c| c.index() < width),
        columns.iter().all(|c| c.index() >= width),
    ) {
        (true, _) => Some((Side::Build, reads)),
        (false, true) => Some((Side::Probe, reads)),
        (false, false) => None,
    }
}

/// A sum's argument over the join output as the product of a build-side
/// and a probe-side factor (`None`: 1): its `Float64` multiplications
/// taken apart, each factor reading one side's columns (or none, counted
/// with the build side). `None` where a factor reads both sides or is not
/// a `Float64`.
#[allow(clippy::type_complexity)]
fn split_product(
    expr: &Arc<dyn PhysicalExpr>,
    schema: &SchemaRef,
    width: usize,
) -> Result<Option<(Option<Arc<dyn PhysicalExpr>>, Option<Arc<dyn PhysicalExpr>>)>> {
    let mut factors = vec![];
    let mut pending = vec![Arc::clone(expr)];
    while let Some(e) = pending.pop() {
        if e.data_type(schema)? != DataType::Float64 {
            return Ok(None);
        }
        match e.downcast_ref::<BinaryExpr>() {
            Some(b) if *b.op() == Operator::Multiply => {
                pending.push(Arc::clone(b.right()));
                pending.push(Arc::clone(b.left()));
            }
            _ => factors.push(e),
        }
    }
    let (mut build, mut probe) = (None, None);
    for factor in factors {
        let Some(side) = side_of(&factor, width) else {
            return Ok(None);
        };
        let local = substitute(factor, |c| local(c, width).1)?;
        let product = match side {
            Side::Build => &mut build,
            Side::Probe => &mut probe,
        };
        *product = Some(match product.take() {
            Some(p) => Arc::new(BinaryExpr::new(p, Operator::Multiply, local)),
            None => local,
        });
    }
    Ok(Some((build, probe)))
}

/// How a listed side's entries are linked to another side's (a chain's
/// build and near sides, by the columns their join compares).
enum Links<'a> {
    /// Not linked (a contraction of two inputs).
    Without,
    /// The values of these expressions numbered, new values given numbers
    /// (the build side).
    Numbered(&'a [Arc<dyn PhysicalExpr>], &'a mut Numbering),
    /// The values of these expressions looked up among those numbered; a
    /// row whose values have no number is not listed (the near side).
    Found(&'a [Arc<dyn PhysicalExpr>], &'a Numbering),
}

impl Build {
    /// The side `plan` (one partition) of `part`, its keys compared under
    /// `nulls`, listed under its keys (in a chain, by link number within
    /// a key), its memory taken from the pool, the time spent listing it
    /// (not reading its input) added to `time` (`build_time` in `EXPLAIN
    /// ANALYZE`).
    async fn collect(
        plan: Arc<dyn ExecutionPlan>,
        part: &Part,
        nulls: Nulls,
        mut links: Links<'_>,
        context: &Arc<TaskContext>,
        time: &Time,
    ) -> Result<Self> {
        let schema = plan.schema();
        let types = (part.keys.iter())
            .map(|k| k.data_type(&schema))
            .collect::<Result<Vec<_>>>()?;
        let mut keys = Numbering::new(&types, nulls)?;
        let mut groups = part.group_numbering(&schema)?;
        let aggregates = part.factors.len();
        let memory =
            MemoryConsumer::new("ContractionExec (build side)").register(context.memory_pool());
        // Each listed row: its key number, group number, link number and
        // factors.
        let (mut key, mut group, mut factor, mut valid) = (vec![], vec![], vec![], vec![]);
        let mut link = vec![];
        let (mut key_numbers, mut group_numbers, mut link_numbers) = (vec![], vec![], vec![]);
        let mut stream = plan.execute(0, Arc::clone(context))?;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let _timer = time.timer();
            let side = part.evaluate(&batch)?;
            keys.number(&side.keys, &mut key_numbers)?;
            match &mut groups {
                Some(g) => g.number(&side.groups, &mut group_numbers)?,
                None => {
                    group_numbers.clear();
                    group_numbers.resize(side.rows, 0);
                }
            }
            match &mut links {
                Links::Without => link_numbers.clear(),
                Links::Numbered(exprs, numbering) => {
                    numbering.number(&evaluate_all(exprs, &batch)?, &mut link_numbers)?
                }
                Links::Found(exprs, numbering) => {
                    numbering.find(&evaluate_all(exprs, &batch)?, &mut link_numbers)?
                }
            }
            let linked = !link_numbers.is_empty();
            key.reserve(side.rows);
            group.reserve(side.rows);
            link.reserve(if linked { side.rows } else { 0 });
            factor.reserve(side.rows * aggregates);
            valid.reserve(side.rows * aggregates);
            for row in 0..side.rows {
                if key_numbers[row] == NONE || (linked && link_numbers[row] == NONE) {
                    continue;
                }
                key.push(key_numbers[row]);
                group.push(group_numbers[row]);
                if linked {
                    link.push(link_numbers[row]);
                }
                for f in &side.factors {
                    let (value, is_valid) = match f {
                        Some(f) => (f.value(row), f.is_valid(row)),
                        None => (1.0, true),
                    };
                    factor.push(value);
                    valid.push(is_valid);
                }
            }
            let held = keys.size()
                + groups.as_ref().map_or(0, Numbering::size)
                + key.capacity() * 8
                + link.capacity() * 8
                + factor.capacity() * 9;
            memory.try_resize(held)?;
        }
        let _timer = time.timer();
        keys.freeze();
        // The rows listed by key number (a counting sort).
        let mut starts = vec![0usize; keys.len() + 1];
        for &k in &key {
            starts[k as usize + 1] += 1;
        }
        for k in 0..keys.len() {
            starts[k + 1] += starts[k];
        }
        let mut next = starts.clone();
        let mut order = vec![0usize; key.len()];
        for (row, &k) in key.iter().enumerate() {
            order[next[k as usize]] = row;
            next[k as usize] += 1;
        }
        // Within a key, by link (a chain's merge needs it) or else by
        // group (stable: the entries of one group keep their order, and so
        // each group's sum its order of additions).
        let listed_by = match link.is_empty() {
            true => &group,
            false => &link,
        };
        if !link.is_empty() || groups.is_some() {
            for k in 0..keys.len() {
                order[starts[k]..starts[k + 1]].sort_by_key(|&row| listed_by[row]);
            }
        }
        let numbers = match &links {
            Links::Without => groups.as_ref().map_or(1, Numbering::len),
            Links::Numbered(_, numbering) => numbering.len(),
            Links::Found(_, numbering) => numbering.len(),
        };
        let dense = (0..keys.len())
            .map(|k| {
                let entries = &order[starts[k]..starts[k + 1]];
                !entries.is_empty()
                    && entries.len() == numbers
                    && (entries.iter().enumerate()).all(|(n, &row)| listed_by[row] as usize == n)
            })
            .collect();
        let all_valid = valid.iter().all(|&v| v);
        // Each row's `aggregates` values, in the order listed.
        fn listed<T: Copy>(order: &[usize], per: usize, values: &[T]) -> Vec<T> {
            match per {
                1 => order.iter().map(|&row| values[row]).collect(),
                _ => {
                    let mut out = Vec::with_capacity(order.len() * per);
                    for &row in order {
                        out.extend_from_slice(&values[row * per..(row + 1) * per]);
                    }
                    out
                }
            }
        }
        let factor = listed(&order, aggregates, &factor);
        let valid = match all_valid {
            true => vec![],
            false => listed(&order, aggregates, &valid),
        };
        let group = order.iter().map(|&row| group[row]).collect();
        let link = match link.is_empty() {
            true => vec![],
            false => order.iter().map(|&row| link[row]).collect(),
        };
        let mut build = Self {
            keys,
            groups,
            starts,
            link,
            group,
            factor,
            valid,
            dense,
            matrix: None,
            memory,
        };
        // Without the memory for it, no matrix: the rows are added one by one.
        build.matrix =
            gemm::matrix(&build, aggregates).filter(|m| build.memory.try_grow(m.size()).is_ok());
        Ok(build)
    }

    /// How many build groups there are.
    fn width(&self) -> usize {
        self.groups.as_ref().map_or(1, Numbering::len)
    }
}

/// One output partition's probe rows summed into their groups.
struct Probe {
    spec: Arc<Spec>,
    collected: Arc<Collected>,
    groups: Groups,
    /// Where the build side is a dense matrix, the probe factors laid out
    /// for a GEMM (`gemm.rs`).
    dense: Option<DenseProduct>,
    numbering: Option<Numbering>,
    memory: MemoryReservation,
    /// Scratch: each probe row's key number, group number, and in a chain
    /// its key number on the near side.
    keys: Vec<u32>,
    numbers: Vec<u32>,
    near_keys: Vec<u32>,
    /// Where the build side gives no group column: after how many probe
    /// rows, and at what ratio of groups to rows, each row is given as its
    /// own group (DataFusion's `skip_partial_aggregation_probe_*`).
    pass_after: Option<(usize, f64)>,
    rows_seen: usize,
    /// Whether each row is now given as its own group.
    passing: bool,
    /// Whether the sums are final (in final mode, until they turn
    /// partial).
    finals: bool,
    /// Whether final sums have just turned partial (they outgrew their
    /// memory, or nearly every row is its own group): the groups so far
    /// were given as partial sums, and so will the rest, for a final
    /// aggregate to merge.
    turned_partial: bool,
    /// In final mode, the metric of the partial sums merged so
    /// (`merged_rows` in `EXPLAIN ANALYZE`).
    merged_rows: Option<Count>,
    /// Probe batches not yet added (small batches are added together).
    pending: Vec<RecordBatch>,
    pending_rows: usize,
}

impl Probe {
    /// Takes `batch`; adds the rows taken when they make `size`. What
    /// [`Self::add`] gives.
    fn push(&mut self, batch: RecordBatch, size: usize) -> Result<Vec<RecordBatch>> {
        self.pending_rows += batch.num_rows();
        self.pending.push(batch);
        match self.pending_rows < size {
            true => Ok(vec![]),
            false => self.flush(size),
        }
    }

    /// Adds the rows taken and not yet added. What [`Self::add`] gives.
    fn flush(&mut self, size: usize) -> Result<Vec<RecordBatch>> {
        let batch = match self.pending.len() {
            0 => return Ok(vec![]),
            1 => self.pending.remove(0),
            _ => concat_batches(&self.pending[0].schema(), &self.pending)?,
        };
        self.pending.clear();
        self.pending_rows = 0;
        self.add(&batch, size)
    }

    /// Adds the products of `batch`'s rows; the groups so far as batches
    /// where their memory could not grow (early, as a partial aggregate
    /// emits under memory pressure).
    fn add(&mut self, batch: &RecordBatch, size: usize) -> Result<Vec<RecordBatch>> {
        let side = self.spec.probe.evaluate(batch)?;
        self.collected.build.keys.find(&side.keys, &mut self.keys)?;
        if self.passing {
            // Each probe row its own group, given as it is summed.
            self.numbers.clear();
            self.numbers.extend(0..side.rows as u32);
            let mut groups = Groups::new(1, side.factors.len());
            self.sum(batch, &side, &mut groups)?;
            let batch = self.batch_of(groups.take(), &side.groups, &[])?;
            return Ok(slices(batch, size));
        }
        match &mut self.numbering {
            Some(n) => n.number(&side.groups, &mut self.numbers)?,
            None => {
                self.numbers.clear();
                self.numbers.resize(side.rows, 0);
            }
        }
        let mut groups = std::mem::replace(&mut self.groups, Groups::new(1, 0));
        let summed = self.sum(batch, &side, &mut groups);
        self.groups = groups;
        summed?;
        if let (Some(numbering), Some((rows, ratio))) = (&self.numbering, self.pass_after) {
            self.rows_seen += side.rows;
            if self.rows_seen >= rows && numbering.len() as f64 >= ratio * self.rows_seen as f64 {
                // Nearly a group per row: the groups so far, and from now
                // on each row's sums as they come (as DataFusion's partial
                // aggregate skips aggregating such rows); the final
                // aggregate merges them (in final mode, one of DataFusion's
                // over this partition's).
                let out = self.turn_partial(size)?;
                self.passing = true;
                self.numbering = None;
                self.memory.try_resize(0)?;
                return Ok(out);
            }
        }
        let held = self.groups.size()
            + self.numbering.as_ref().map_or(0, Numbering::size)
            + self.dense.as_ref().map_or(0, DenseProduct::size);
        match self.memory.try_resize(held) {
            Ok(()) => Ok(vec![]),
            Err(e) => {
                // Final sums can't be given early: partial from here on.
                let out = self.turn_partial(size)?;
                if out.is_empty() {
                    return Err(e);
                }
                self.memory.try_resize(
                    self.numbering.as_ref().map_or(0, Numbering::size)
                        + self.dense.as_ref().map_or(0, DenseProduct::size),
                )?;
                Ok(out)
            }
        }
    }

    /// The groups so far, as partial sums (in final mode, for a final
    /// aggregate to merge with the rest: see [`Self::turned_partial`]).
    fn turn_partial(&mut self, size: usize) -> Result<Vec<RecordBatch>> {
        self.turned_partial = self.finals;
        self.finals = false;
        self.emit(size)
    }

    /// Adds the products of `batch`'s rows (`side` its probe columns,
    /// their key and group numbers in `self.keys` and `self.numbers`) to
    /// `groups`.
    fn sum(&mut self, batch: &RecordBatch, side: &Evaluated, groups: &mut Groups) -> Result<()> {
        let numbered = Numbered {
            side,
            keys: &self.keys,
            groups: &self.numbers,
        };
        let collected = &self.collected;
        match (&self.spec.near, &collected.near) {
            (Some(chain), Some(near)) => {
                let near_keys = evaluate_all(&chain.probe_keys, batch)?;
                near.keys.find(&near_keys, &mut self.near_keys)?;
                chain::add(&numbered, &self.near_keys, &collected.build, near, groups);
            }
            _ => add_pairs(&numbered, &collected.build, self.dense.as_mut(), groups),
        }
        Ok(())
    }

    /// The groups met so far as batches of at most `size` rows; none left.
    fn emit(&mut self, size: usize) -> Result<Vec<RecordBatch>> {
        if let Some(dense) = &mut self.dense {
            dense.flush(&self.collected.build, &mut self.groups);
        }
        if self.groups.is_empty() {
            return Ok(vec![]);
        }
        let emitted = self.groups.take();
        let probe_values = match &self.numbering {
            Some(n) => n.values()?,
            None => vec![],
        };
        let build_values = match &self.collected.build.groups {
            Some(n) => n.values()?,
            None => vec![],
        };
        Ok(slices(
            self.batch_of(emitted, &probe_values, &build_values)?,
            size,
        ))
    }

    /// The output rows of `emitted`, the values of its probe and build
    /// group numbers in `probe_values` and `build_values`.
    fn batch_of(
        &self,
        emitted: Emitted,
        probe_values: &[ArrayRef],
        build_values: &[ArrayRef],
    ) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = vec![];
        for &(side, at) in &self.spec.group_order {
            let (values, numbers) = match side {
                Side::Build => (build_values, &emitted.build),
                Side::Probe => (probe_values, &emitted.probe),
            };
            columns.push(take(values[at].as_ref(), numbers, None)?);
        }
        columns.extend(emitted.sums.into_iter().map(|s| Arc::new(s) as ArrayRef));
        let schema = match self.finals {
            true => self.spec.output_schema(),
            false => &self.spec.schema,
        };
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }
}

/// What one partition of a [`ContractionExec`] is at: summing its probe
/// rows (`None`: they have ended) and giving the batches `out` (last
/// first), or in final mode, after its sums turned partial (they outgrew
/// their memory, or nearly every row was its own group), giving what a
/// final aggregate merged.
enum Stage {
    Summing {
        input: Option<SendableRecordBatchStream>,
        sums: Box<Probe>,
        out: Vec<RecordBatch>,
    },
    Merging(SendableRecordBatchStream),
}

/// The output of one partition: `input`'s rows summed by `sums`, the groups
/// given at the end (or early, as partial sums, under memory pressure; in
/// final mode, those and the rest's partial sums merged by DataFusion's
/// final aggregate, which spills where it can).
fn summed(
    input: SendableRecordBatchStream,
    sums: Probe,
    metrics: BaselineMetrics,
    size: usize,
    context: Arc<TaskContext>,
) -> BoxStream<'static, Result<RecordBatch>> {
    let start = Stage::Summing {
        input: Some(input),
        sums: Box::new(sums),
        out: vec![],
    };
    futures::stream::try_unfold((start, metrics), move |(mut stage, metrics)| {
        let context = Arc::clone(&context);
        async move {
            loop {
                let (input, sums, out) = match &mut stage {
                    Stage::Merging(merged) => {
                        return match merged.next().await {
                            Some(batch) => {
                                let batch = batch?;
                                metrics.record_output(batch.num_rows());
                                Ok(Some((batch, (stage, metrics))))
                            }
                            None => {
                                metrics.done();
                                Ok(None)
                            }
                        };
                    }
                    Stage::Summing { input, sums, out } => (input, sums, out),
                };
                if let Some(batch) = out.pop() {
                    metrics.record_output(batch.num_rows());
                    return Ok(Some((batch, (stage, metrics))));
                }
                let Some(stream) = input.as_mut() else {
                    metrics.done();
                    return Ok(None);
                };
                let next = stream.next().await;
                let timer = metrics.elapsed_compute().timer();
                match next {
                    Some(batch) => *out = sums.push(batch?, size)?,
                    None => {
                        *input = None;
                        *out = sums.flush(size)?;
                        out.extend(sums.emit(size)?);
                    }
                }
                timer.done();
                out.reverse();
                if std::mem::take(&mut sums.turned_partial) {
                    let Stage::Summing { input, sums, out } = stage else {
                        unreachable!("summing")
                    };
                    let spec = Arc::clone(&sums.spec);
                    let counted = sums.merged_rows.clone();
                    let rest = Stage::Summing { input, sums, out };
                    let mut partial = summed_from(rest, size, Arc::clone(&context));
                    if let Some(count) = counted {
                        partial = partial.inspect_ok(move |b| count.add(b.num_rows())).boxed();
                    }
                    stage = Stage::Merging(merged::merge(&spec, partial, &context)?);
                }
            }
        }
    })
    .boxed()
}

/// [`summed`] from `stage` on, its metrics not recorded (the partial sums
/// a final aggregate merges).
fn summed_from(
    stage: Stage,
    size: usize,
    context: Arc<TaskContext>,
) -> BoxStream<'static, Result<RecordBatch>> {
    let Stage::Summing { input, sums, out } = stage else {
        unreachable!("summing")
    };
    let metrics = BaselineMetrics::new(&ExecutionPlanMetricsSet::new(), 0);
    let given = futures::stream::iter(out.into_iter().rev().map(Ok));
    match input {
        Some(input) => given
            .chain(summed(input, *sums, metrics, size, context))
            .boxed(),
        None => given.boxed(),
    }
}

/// `batch` as batches of at most `size` rows.
fn slices(batch: RecordBatch, size: usize) -> Vec<RecordBatch> {
    let rows = batch.num_rows();
    (0..rows)
        .step_by(size.max(1))
        .map(|start| batch.slice(start, size.min(rows - start)))
        .collect()
}

/// A batch of probe rows evaluated and numbered: its columns, each row's
/// key number on the build side and group number.
struct Numbered<'a> {
    side: &'a Evaluated,
    keys: &'a [u32],
    groups: &'a [u32],
}

impl Numbered<'_> {
    /// Whether some factor of the rows or of `build`'s entries is NULL.
    fn checked(&self, build: &Build) -> bool {
        !build.valid.is_empty()
            || self
                .side
                .factors
                .iter()
                .flatten()
                .any(|f| f.null_count() > 0)
    }

    /// Row `row`'s factor of aggregate `a` (1 where its side has none), or
    /// `None` where it is NULL.
    #[inline]
    fn factor(&self, row: usize, a: usize) -> Option<f64> {
        match &self.side.factors[a] {
            Some(f) if f.is_null(row) => None,
            Some(f) => Some(f.value(row)),
            None => Some(1.0),
        }
    }
}

impl Build {
    /// Entry `entry`'s factor of aggregate `a` of `aggregates`, or `None`
    /// where it is NULL.
    #[inline]
    fn factor(&self, entry: usize, a: usize, aggregates: usize) -> Option<f64> {
        let at = entry * aggregates + a;
        match self.valid.is_empty() || self.valid[at] {
            true => Some(self.factor[at]),
            false => None,
        }
    }
}

/// Adds the products of `rows` with the build entries under their keys
/// (laying out in `dense`, where it is given, the factors of the rows whose
/// key's list is dense).
fn add_pairs(
    rows: &Numbered,
    build: &Build,
    mut dense: Option<&mut DenseProduct>,
    groups: &mut Groups,
) {
    let aggregates = rows.side.factors.len();
    let checked = rows.checked(build);
    let mut probe_factors = vec![0.0; aggregates];
    for row in 0..rows.side.rows {
        let k = rows.keys[row];
        if k == NONE {
            continue;
        }
        let probe_group = rows.groups[row];
        let entries = build.starts[k as usize]..build.starts[k as usize + 1];
        if !checked && build.dense[k as usize] {
            if let Some(dense) = dense.as_deref_mut() {
                let p = rows.factor(row, 0).unwrap_or_default();
                if dense.take(probe_group, k, p) {
                    continue;
                }
            }
            // One product per build group, in the order of the groups: the
            // row's sums side by side, each a multiply-add.
            if let Some(sums) = groups.row(probe_group) {
                let factors = &build.factor[entries.start * aggregates..entries.end * aggregates];
                for (a, p) in probe_factors.iter_mut().enumerate() {
                    *p = rows.factor(row, a).unwrap_or_default();
                }
                match probe_factors[..] {
                    [p] => axpy(p, factors, sums),
                    _ => {
                        let per_group = sums.chunks_exact_mut(aggregates);
                        for (sums, factors) in per_group.zip(factors.chunks_exact(aggregates)) {
                            for a in 0..aggregates {
                                sums[a] += probe_factors[a] * factors[a];
                            }
                        }
                    }
                }
                continue;
            }
        }
        for entry in entries {
            let place = groups.place(probe_group, build.group[entry]);
            for a in 0..aggregates {
                if !checked {
                    let p = rows.factor(row, a).unwrap_or_default();
                    groups.add(place, a, p * build.factor[entry * aggregates + a]);
                } else if let (Some(p), Some(b)) =
                    (rows.factor(row, a), build.factor(entry, a, aggregates))
                {
                    groups.add(place, a, p * b);
                }
            }
        }
    }
}

/// `y += a · x`, element by element.
#[inline]
fn axpy(a: f64, x: &[f64], y: &mut [f64]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `Σ x · y`, in four running sums (which the compiler vectorizes).
#[inline]
fn dot(x: &[f64], y: &[f64]) -> f64 {
    let mut lanes = [0.0; 4];
    let (x4, y4) = (x.chunks_exact(4), y.chunks_exact(4));
    let rest: f64 = (x4.remainder().iter().zip(y4.remainder()))
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in x4.zip(y4) {
        for l in 0..4 {
            lanes[l] += x[l] * y[l];
        }
    }
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + rest
}

impl DisplayAs for ContractionExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let on: Vec<String> = (self.spec.build.keys.iter())
            .zip(&self.spec.probe.keys)
            .map(|(b, p)| format!("({b}, {p})"))
            .collect();
        let fields = self.spec.output_schema().fields();
        let groups = self.spec.group_order.len();
        let group_names: Vec<&str> = fields[..groups].iter().map(|f| f.name().as_str()).collect();
        let sums: Vec<&str> = fields[groups..].iter().map(|f| f.name().as_str()).collect();
        let mode = match self.spec.merged {
            Some(_) => "mode=Final, ",
            None => "",
        };
        write!(
            f,
            "ContractionExec: {mode}gby=[{}], aggr=[{}], on=[{}]",
            group_names.join(", "),
            sums.join(", "),
            on.join(", "),
        )?;
        if self.spec.nulls == Nulls::Grouped {
            write!(f, ", NullsEqual: true")?;
        }
        if self.kept {
            write!(f, ", kept: true")?;
        }
        if let Some(chain) = &self.spec.near {
            let through: Vec<String> = (chain.part.keys.iter())
                .zip(&chain.probe_keys)
                .map(|(n, p)| format!("({n}, {p})"))
                .collect();
            let links: Vec<String> = (chain.build_links.iter())
                .zip(&chain.links)
                .map(|(b, n)| format!("({b}, {n})"))
                .collect();
            write!(
                f,
                ", links=[{}], through=[{}]",
                links.join(", "),
                through.join(", ")
            )?;
            if chain.nulls == Nulls::Grouped {
                write!(f, ", NullsEqual through: true")?;
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for ContractionExec {
    fn name(&self) -> &str {
        "ContractionExec"
    }

    kit::own_properties!();
    kit::own_metrics!();

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let mut recursion = TreeNodeRecursion::Continue;
        let near = self.spec.near.as_ref();
        let parts = [&self.spec.build, &self.spec.probe]
            .into_iter()
            .chain(near.map(|c| &c.part));
        for part in parts {
            let factors = part.factors.iter().flatten();
            for e in part.keys.iter().chain(&part.groups).chain(factors) {
                recursion = recursion.visit_sibling(|| f(e))?;
            }
        }
        let links = near
            .into_iter()
            .flat_map(|c| (c.links.iter()).chain(&c.build_links).chain(&c.probe_keys));
        for e in links {
            recursion = recursion.visit_sibling(|| f(e))?;
        }
        Ok(recursion)
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        let mut children = vec![&self.left];
        children.extend(&self.near);
        children.push(&self.right);
        children
    }

    /// The collected sides in one partition, the probe side as it comes (in
    /// final mode, hashed by its group columns).
    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        let mut per_child = vec![Distribution::SinglePartition; self.children().len() - 1];
        per_child.push(match &self.spec.merged {
            Some(merged) => merged.probe_distribution(&self.spec.probe.groups),
            None => Distribution::UnspecifiedDistribution,
        });
        InputDistributionRequirements::new(per_child)
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        let mut benefits = vec![false; self.children().len() - 1];
        benefits.push(true);
        benefits
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != self.children().len() {
            return internal_err!("ContractionExec with {} new children", children.len());
        }
        let exec = Self::from_replaced(Arc::clone(&self.spec.replaced), children)?;
        Ok(Arc::new(self.sharing(exec)))
    }

    /// A copy that collects its sides anew, unless they are kept.
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        let exec = Self::new(
            Arc::clone(&self.spec),
            Arc::clone(&self.left),
            self.near.clone(),
            Arc::clone(&self.right),
            Arc::clone(&self.properties),
        );
        Ok(Arc::new(self.sharing(exec)))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let build = self.build(&context);
        let probe = self.right.execute(partition, Arc::clone(&context))?;
        let spec = Arc::clone(&self.spec);
        let size = context.session_config().batch_size();
        let execution = &context.session_config().options().execution;
        let skip = (
            execution.skip_partial_aggregation_probe_rows_threshold,
            execution.skip_partial_aggregation_probe_ratio_threshold,
        );
        let memory = MemoryConsumer::new(format!("ContractionExec[{partition}]"))
            .register(context.memory_pool());
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let gemm_rows = MetricBuilder::new(&self.metrics).counter("gemm_rows", partition);
        let merged_rows = (self.spec.merged.as_ref())
            .map(|_| MetricBuilder::new(&self.metrics).counter("merged_rows", partition));
        let probe_schema = self.right.schema();
        let schema = Arc::clone(self.spec.output_schema());
        let state = async move {
            let collected = build.await.map_err(DataFusionError::Shared)?;
            let numbering = spec.probe.group_numbering(&probe_schema)?;
            let finals = spec.merged.is_some();
            let pass_after = collected.build.groups.is_none().then_some(skip);
            let groups = Groups::new(collected.build.width(), spec.probe.factors.len());
            let dense = match spec.near {
                None => DenseProduct::of(&collected.build, gemm_rows),
                Some(_) => None,
            };
            let sums = Probe {
                spec,
                collected,
                groups,
                dense,
                numbering,
                memory,
                keys: vec![],
                numbers: vec![],
                near_keys: vec![],
                pass_after,
                rows_seen: 0,
                passing: false,
                finals,
                turned_partial: false,
                merged_rows,
                pending: vec![],
                pending_rows: 0,
            };
            Ok::<_, DataFusionError>(summed(probe, sums, metrics, size, context))
        };
        let stream = futures::stream::once(state).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}
