//! Final mode: a contraction that gives the final sums, in place of its
//! partial sums and the final aggregate that merges them.
//!
//! A contraction's probe rows are dealt over the partitions as they come,
//! so a group's products may be summed in every partition, and
//! DataFusion's final aggregate above hashes the partial sums by their
//! group columns and merges them (for `∂/∂X` of a matrix product, 1.6M
//! partial rows into 800,000 groups). A group's products all come from
//! probe rows with its values of the probe side's group columns: where the
//! probe rows are hashed by those columns instead, each group is summed in
//! one partition and its sum there is final. [`finals`] makes such a
//! [`ContractionExec`] of each `FinalPartitioned` aggregate right above a
//! contraction's hash repartition (the partial sums' groups reading the
//! probe side), and keeps what the plan above relied on: where an operator
//! required the aggregate's rows hashed by columns the contraction's
//! partitioning does not give, they are hashed again as they were. Under
//! memory pressure, or where nearly every probe row is its own group (as
//! in partial mode, DataFusion's `skip_partial_aggregation_probe_*`
//! settings), the sums so far are given as partial sums, and so are the
//! rest, to a final aggregate of DataFusion's over the partition (which
//! spills where it can): the same answer as before, never an early final
//! sum.
//!
//! In one partition (`target_partitions = 1`) DataFusion plans no partial
//! aggregate: one `Single` aggregate does both steps over the join. It is
//! taken as the `Final` aggregate over the `Partial` one it combines, and
//! the contraction replaces both; its probe rows stay in their one
//! partition, where every group is summed whichever side gives its
//! columns.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::{
    replace_children_if_necessary, Boundedness, EmissionType,
};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{
    Distribution, ExecutionPlan, ExecutionPlanProperties, InputOrderMode, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use futures::stream::BoxStream;

use super::{at_joins, float_sum, unrepartitioned, ContractionExec, Side, Spec};
use crate::exec::aggregate_as;

/// The final aggregate a [`ContractionExec`] in final mode replaces too.
#[derive(Debug, Clone)]
pub(super) struct Merged {
    /// The final aggregate, over the partial sums' repartition.
    aggregate: Arc<dyn ExecutionPlan>,
    /// Its output: the group columns, then each sum.
    pub(super) schema: SchemaRef,
}

impl Merged {
    /// How the probe rows must come: hashed by the probe side's group
    /// columns `groups`, or, under a `Final` aggregate, in one partition.
    pub(super) fn probe_distribution(&self, groups: &[Arc<dyn PhysicalExpr>]) -> Distribution {
        match self
            .aggregate
            .downcast_ref::<AggregateExec>()
            .map(AggregateExec::mode)
        {
            Some(AggregateMode::Final) => Distribution::SinglePartition,
            _ => Distribution::KeyPartitioned(groups.to_vec()),
        }
    }
}

/// `plan` with each `FinalPartitioned` aggregate of a contraction's partial
/// sums replaced by the contraction in final mode (see the [module
/// docs](self)), the rows hashed again where an operator above required
/// the aggregate's partitioning.
pub(super) fn finals(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    // A subplan reached by several paths (a shared input) is rebuilt once.
    rebuilt(&plan, &mut HashMap::new())
}

/// [`finals`]' table of the nodes rebuilt, by address.
type Done = HashMap<*const (), Arc<dyn ExecutionPlan>>;

/// `plan` with its finals replaced (see [`finals`]), itself too.
fn rebuilt(plan: &Arc<dyn ExecutionPlan>, done: &mut Done) -> Result<Arc<dyn ExecutionPlan>> {
    let key = Arc::as_ptr(plan) as *const ();
    if let Some(plan) = done.get(&key) {
        return Ok(Arc::clone(plan));
    }
    let children = plan.children();
    let required = plan.input_distribution_requirements().into_per_child();
    let mut changed = false;
    // The new children; the same, each hashed again as the node had it
    // where its partitioning changed.
    let (mut new_children, mut as_they_were) = (vec![], vec![]);
    for (i, child) in children.into_iter().enumerate() {
        let new = rebuilt(child, done)?;
        if Arc::ptr_eq(&new, child) {
            new_children.push(Arc::clone(&new));
            as_they_were.push(new);
            continue;
        }
        changed = true;
        let was = child.output_partitioning();
        let again = match was {
            Partitioning::Hash(..) if new.output_partitioning() != was => {
                Arc::new(RepartitionExec::try_new(Arc::clone(&new), was.clone())?)
            }
            _ => Arc::clone(&new),
        };
        let required = (required.get(i)).unwrap_or(&Distribution::UnspecifiedDistribution);
        if gives(child, required) && !gives(&new, required) {
            if !matches!(was, Partitioning::Hash(..)) {
                return internal_err!("a contraction's final sums, partitioned as {was}");
            }
            new_children.push(Arc::clone(&again));
        } else {
            new_children.push(new);
        }
        as_they_were.push(again);
    }
    let mut new = match changed {
        true => match replace_children_if_necessary(Arc::clone(plan), new_children) {
            Ok(new) => new,
            // A node that needs its children partitioned alike and says so
            // only when it is made (an interleaving union): each hashed
            // again as it was.
            Err(_) => replace_children_if_necessary(Arc::clone(plan), as_they_were)?,
        },
        false => Arc::clone(plan),
    };
    if let Some(exec) = finalized(&new)? {
        new = Arc::new(exec);
    }
    done.insert(key, Arc::clone(&new));
    Ok(new)
}

/// Whether `plan`'s rows are partitioned exactly as `required` (hashed by
/// some of the keys is not enough for a join, whose other input is hashed
/// by all of them).
fn gives(plan: &Arc<dyn ExecutionPlan>, required: &Distribution) -> bool {
    (plan.output_partitioning())
        .satisfaction(required, plan.equivalence_properties(), false)
        .is_satisfied()
}

/// Whether `plan` is a final aggregate (what a contraction in final mode
/// replaces).
pub(super) fn is_final(plan: &Arc<dyn ExecutionPlan>) -> bool {
    matches!(
        plan.downcast_ref::<AggregateExec>()
            .map(AggregateExec::mode),
        Some(AggregateMode::FinalPartitioned | AggregateMode::Final)
    )
}

/// A `Single` aggregate (DataFusion's partial and final aggregate in one,
/// where its input is one partition: `target_partitions = 1`) as the
/// `Final` aggregate over the `Partial` one that it combines. `None` where
/// it is not a `Single` aggregate over one partition, or it has a limit
/// (which the two steps would drop) or reads its input in order (an order
/// a contraction does not keep).
fn split(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(aggregate) = plan.downcast_ref::<AggregateExec>() else {
        return Ok(None);
    };
    let input = aggregate.input();
    if *aggregate.mode() != AggregateMode::Single
        || input.output_partitioning().partition_count() != 1
        || aggregate.limit_options().is_some()
        || *aggregate.input_order_mode() != InputOrderMode::Linear
    {
        return Ok(None);
    }
    let group_by = aggregate.group_expr();
    let partial = aggregate_as(
        aggregate,
        AggregateMode::Partial,
        group_by.clone(),
        Arc::clone(input),
    )?;
    let merged = aggregate_as(
        aggregate,
        AggregateMode::Final,
        group_by.as_final(),
        Arc::new(partial),
    )?;
    Ok(Some(Arc::new(merged)))
}

/// The contraction in final mode that replaces `plan`, where it is a
/// `FinalPartitioned` aggregate of sums right above a hash repartition of
/// a contraction's partial sums (or of the partial aggregate a contraction
/// replaces), whose probe side gives group columns; or a `Final` aggregate
/// right above them in one partition, or a `Single` one (both at once)
/// over one partition, where every group is summed in that partition
/// whichever side gives its columns.
pub(super) fn finalized(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<ContractionExec>> {
    if let Some(plan) = split(plan)? {
        return finalized(&plan);
    }
    let Some(aggregate) = plan.downcast_ref::<AggregateExec>() else {
        return Ok(None);
    };
    let group_by = aggregate.group_expr();
    let plain = is_final(plan)
        && group_by.is_single()
        && aggregate.filter_expr().iter().all(Option::is_none)
        && aggregate.limit_options().is_none()
        && *aggregate.input_order_mode() == InputOrderMode::Linear
        && aggregate.aggr_expr().iter().all(|a| float_sum(a));
    if !plain {
        return Ok(None);
    }
    // Where the partial sums are hashed by their groups, the repartition
    // that does it; `None` in one partition.
    let hashing = match aggregate.mode() {
        AggregateMode::Final => None,
        _ => match aggregate.input().downcast_ref::<RepartitionExec>() {
            Some(r)
                if matches!(r.partitioning(), Partitioning::Hash(..)) && !r.preserve_order() =>
            {
                Some(r)
            }
            _ => return Ok(None),
        },
    };
    let below = match hashing {
        Some(repartition) => repartition.input(),
        None => aggregate.input(),
    };
    let partial = match below.downcast_ref::<ContractionExec>() {
        Some(c) if c.spec.merged.is_none() => ContractionExec::new(
            Arc::clone(&c.spec),
            Arc::clone(&c.left),
            c.near.clone(),
            Arc::clone(&c.right),
            Arc::clone(&c.properties),
        ),
        Some(_) => return Ok(None),
        None => match ContractionExec::try_from_plan(below)? {
            Some(c) => c,
            None => return Ok(None),
        },
    };
    let spec = &partial.spec;
    // The final aggregate's groups are the partial sums' group columns in
    // their order, its sums theirs.
    let groups = spec.group_order.len();
    let same_groups = group_by.expr().len() == groups
        && (group_by.expr().iter().enumerate())
            .all(|(i, (e, _))| matches!(e.downcast_ref::<Column>(), Some(c) if c.index() == i));
    let sums = spec.schema.fields().len() - groups;
    if !same_groups || aggregate.aggr_expr().len() != sums {
        return Ok(None);
    }
    let schema = aggregate.schema();
    let (right, properties) = match hashing {
        None => {
            // One partition: the probe rows as they are, the output as the
            // final aggregate's.
            if partial.properties.partitioning.partition_count() != 1 {
                return Ok(None);
            }
            (
                Arc::clone(&partial.right),
                Arc::clone(aggregate.properties()),
            )
        }
        Some(_) => {
            if spec.probe.groups.is_empty() {
                return Ok(None);
            }
            // The probe rows hashed by the probe side's group columns, and
            // so the output, by those columns as they are named there.
            let partitions = aggregate.properties().partitioning.partition_count();
            let hashed = Partitioning::Hash(spec.probe.groups.clone(), partitions);
            let right = match partial.right.output_partitioning() == &hashed {
                true => Arc::clone(&partial.right),
                false => Arc::new(RepartitionExec::try_new(
                    unrepartitioned(&partial.right),
                    hashed,
                )?) as Arc<dyn ExecutionPlan>,
            };
            let partitioned_by = (0..spec.probe.groups.len())
                .map(|i| {
                    let at = (spec.group_order.iter())
                        .position(|&place| place == (Side::Probe, i))
                        .expect("each probe group column is an output column");
                    Arc::new(Column::new(schema.field(at).name(), at)) as Arc<dyn PhysicalExpr>
                })
                .collect();
            let properties = PlanProperties::new(
                EquivalenceProperties::new(Arc::clone(&schema)),
                Partitioning::Hash(partitioned_by, partitions),
                EmissionType::Final,
                Boundedness::Bounded,
            );
            (right, Arc::new(properties))
        }
    };
    let mut inputs = vec![Arc::clone(&partial.left)];
    inputs.extend(partial.near.clone());
    inputs.push(Arc::clone(&right));
    let mut below = at_joins(Arc::clone(&spec.replaced), inputs)?;
    if hashing.is_some() {
        below = replace_children_if_necessary(Arc::clone(aggregate.input()), vec![below])?;
    }
    let mut spec = (**spec).clone();
    spec.replaced = replace_children_if_necessary(Arc::clone(plan), vec![below])?;
    spec.merged = Some(Merged {
        aggregate: Arc::clone(plan),
        schema,
    });
    Ok(Some(ContractionExec::new(
        Arc::new(spec),
        Arc::clone(&partial.left),
        partial.near.clone(),
        right,
        properties,
    )))
}

/// The final aggregate `spec` replaces, over the partial sums `partial` (of
/// one partition, whose groups no other partition has), as a stream.
pub(super) fn merge(
    spec: &Spec,
    partial: BoxStream<'static, Result<RecordBatch>>,
    context: &Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let Some(aggregate) =
        (spec.merged.as_ref()).and_then(|m| m.aggregate.downcast_ref::<AggregateExec>())
    else {
        return internal_err!("a contraction's partial sums merged without its final aggregate");
    };
    let given = Once {
        schema: Arc::clone(&spec.schema),
        stream: Mutex::new(Some(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&spec.schema),
            partial,
        )))),
    };
    let input = StreamingTableExec::try_new(
        Arc::clone(&spec.schema),
        vec![Arc::new(given)],
        None,
        vec![],
        false,
        None,
    )?;
    let merged = aggregate_as(
        aggregate,
        AggregateMode::Final,
        aggregate.group_expr().clone(),
        Arc::new(input),
    )?;
    merged.execute(0, Arc::clone(context))
}

/// A stream given once, as the one partition of a [`StreamingTableExec`].
struct Once {
    schema: SchemaRef,
    stream: Mutex<Option<SendableRecordBatchStream>>,
}

impl fmt::Debug for Once {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Once")
            .field("schema", &self.schema)
            .finish()
    }
}

impl PartitionStream for Once {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self.stream.lock().expect("stream lock").take();
        taken.unwrap_or_else(|| {
            let failed = futures::stream::once(async {
                internal_err!("a contraction's partial sums read twice")
            });
            Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                failed,
            ))
        })
    }
}
