//! The gradient table summed into the parameter rows
//! ([`crate::plan::reverse`]'s group join), executed: [`GroupJoinExec`]
//! builds a hash table (or a dense index, [`super::row_index`]) over the
//! rows' identities and sums every contribution into its row.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    new_empty_array, Array, ArrayRef, AsArray, BooleanArray, Float64Array, RecordBatch,
};
use datafusion::arrow::compute::{concat, filter_record_batch, prep_null_mask_filter};
use datafusion::arrow::datatypes::Float64Type;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{internal_err, DataFusionError};
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, Time};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::future::try_join_all;
use futures::{StreamExt, TryStreamExt};

use super::kit;
use super::row_index::{Duplicate, RowIndex, Sums};

/// Sums the contributions into the parameter rows through a hash table
/// over the rows' identities; see the [module docs](self).
#[derive(Debug)]
pub struct GroupJoinExec {
    pub(crate) rows: Arc<dyn ExecutionPlan>,
    pub(crate) contributions: Arc<dyn ExecutionPlan>,
    /// Sums keyed by the identity, at most one per row: a row's is added
    /// times its factor, the column of `rows` after the output's (one per
    /// sums, in order; none where either is NULL).
    pub(crate) scaled: Vec<Arc<dyn ExecutionPlan>>,
    pub(crate) duplicate: Arc<Duplicate>,
    /// The columns of `rows` that are the identity.
    pub(crate) identity: Vec<usize>,
    /// A condition on the rows: only those where it holds are output, and
    /// where it holds on none nothing is summed (see the logical node's
    /// `keep`).
    pub(crate) keep: Option<Arc<dyn PhysicalExpr>>,
    pub(crate) schema: SchemaRef,
    pub(crate) properties: Arc<PlanProperties>,
    pub(crate) metrics: ExecutionPlanMetricsSet,
}

impl DisplayAs for GroupJoinExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "GroupJoinExec")?;
        match &self.keep {
            Some(keep) => write!(f, ": keep={keep}"),
            None => Ok(()),
        }
    }
}

impl ExecutionPlan for GroupJoinExec {
    kit::own_properties!();
    kit::own_metrics!();
    kit::no_expressions!();

    fn name(&self) -> &str {
        "GroupJoinExec"
    }

    /// The rows, the contributions, then the scaled sums.
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        let mut children = vec![&self.rows, &self.contributions];
        children.extend(&self.scaled);
        children
    }

    /// Every input partition is read here, each on its own task: a
    /// repartitioning in front would only copy rows.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; 2 + self.scaled.len()]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 2 + self.scaled.len() {
            return internal_err!("GroupJoinExec has {} children", 2 + self.scaled.len());
        }
        let mut children = children.into_iter();
        Ok(Arc::new(Self {
            rows: children.next().expect("rows"),
            contributions: children.next().expect("contributions"),
            scaled: children.collect(),
            duplicate: Arc::clone(&self.duplicate),
            identity: self.identity.clone(),
            keep: self.keep.clone(),
            schema: Arc::clone(&self.schema),
            properties: Arc::clone(&self.properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("GroupJoinExec has one partition");
        }
        let (rows, contributions, check, schema) = (
            Arc::clone(&self.rows),
            Arc::clone(&self.contributions),
            Arc::clone(&self.duplicate),
            Arc::clone(&self.schema),
        );
        let scaled = self.scaled.clone();
        let identity = self.identity.clone();
        let keep = self.keep.clone();
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let out = Arc::clone(&schema);
        let output = async move {
            let reservation = MemoryConsumer::new("GroupJoinExec").register(context.memory_pool());
            let rows_schema = rows.schema();
            let batches = collect(rows, Arc::clone(&context)).await?;
            // Each batch's rows kept (`None`: all of them).
            let kept = match &keep {
                Some(keep) => {
                    let _timer = metrics.elapsed_compute().timer();
                    batches
                        .iter()
                        .map(|b| rows_kept(keep, b).map(Some))
                        .collect::<Result<Vec<_>>>()?
                }
                None => vec![None; batches.len()],
            };
            let none_kept = keep.is_some()
                && kept
                    .iter()
                    .all(|k| k.as_ref().is_some_and(|k| k.true_count() == 0));
            if none_kept {
                // As a join of no rows: the other side is not read.
                metrics.done();
                let none: Vec<Result<RecordBatch>> = vec![];
                return Ok::<_, DataFusionError>(futures::stream::iter(none).boxed());
            }
            let size = batches.iter().map(RecordBatch::get_array_memory_size).sum();
            reservation.try_grow(size)?;
            let count = batches.iter().map(RecordBatch::num_rows).sum();
            // A column of all the rows (the batches are passed on as read).
            let whole = |i: usize| -> Result<ArrayRef> {
                match batches.as_slice() {
                    [] => Ok(new_empty_array(rows_schema.field(i).data_type())),
                    [one] => Ok(Arc::clone(one.column(i))),
                    all => {
                        let parts: Vec<&dyn Array> =
                            all.iter().map(|b| b.column(i).as_ref()).collect();
                        Ok(concat(&parts)?)
                    }
                }
            };
            let time = metrics.elapsed_compute().clone();
            let index = {
                let _timer = time.timer();
                let keys = identity.iter().map(|&i| whole(i)).collect::<Result<_>>()?;
                Arc::new(RowIndex::build(keys, count, &check, reservation)?)
            };
            let inputs = std::iter::once((contributions, false))
                .chain(scaled.into_iter().map(|s| (s, true)))
                .map(|(plan, touched)| summed(plan, &index, &context, &time, touched));
            let mut sums = try_join_all(inputs).await?.into_iter();
            let mut total = sums.next().expect("the contributions");
            let visible = rows_schema.fields().len() - sums.len();
            for (s, sums) in sums.enumerate() {
                let factors = whole(visible + s)?;
                let Some(factors) = factors.as_primitive_opt::<Float64Type>() else {
                    return internal_err!("a group join's factors are doubles");
                };
                let _timer = time.timer();
                for (r, total) in total.values.iter_mut().enumerate() {
                    if sums.is_touched(r) && factors.is_valid(r) {
                        *total += factors.value(r) * sums.values[r];
                    }
                }
            }
            let output_rows = kept.iter().zip(&batches).map(|(k, b)| match k {
                Some(k) => k.true_count(),
                None => b.num_rows(),
            });
            metrics.record_output(output_rows.sum());
            metrics.done();
            // Each batch of rows as read (those kept), with its rows'
            // gradients (copied: slices of one large array each count as
            // all of it in a consumer's memory accounting).
            let gradients = std::mem::take(&mut total.values);
            let mut start = 0;
            let batches = batches.into_iter().zip(kept).map(move |(b, kept)| {
                let end = start + b.num_rows();
                let mut columns = b.columns()[..visible].to_vec();
                columns.push(Arc::new(Float64Array::from(gradients[start..end].to_vec())));
                start = end;
                let batch = RecordBatch::try_new(Arc::clone(&out), columns)?;
                Ok(match kept {
                    Some(kept) => filter_record_batch(&batch, &kept)?,
                    None => batch,
                })
            });
            Ok::<_, DataFusionError>(futures::stream::iter(batches).boxed())
        };
        let stream = futures::stream::once(output).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// The rows of `batch` where `keep` holds (NULL: not kept).
fn rows_kept(keep: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<BooleanArray> {
    let holds = keep.evaluate(batch)?.into_array(batch.num_rows())?;
    let Some(holds) = holds.as_boolean_opt() else {
        return internal_err!("a group join's condition is a boolean");
    };
    Ok(match holds.null_count() {
        0 => holds.clone(),
        _ => prep_null_mask_filter(holds),
    })
}

/// The contributions of every partition of `plan` summed per parameter row
/// of `index`, each partition on its own task; with `touched`, the rows
/// that got one marked.
async fn summed(
    plan: Arc<dyn ExecutionPlan>,
    index: &Arc<RowIndex>,
    context: &Arc<TaskContext>,
    time: &Time,
    touched: bool,
) -> Result<Sums> {
    let tasks: Vec<_> = (0..plan.output_partitioning().partition_count())
        .map(|p| {
            let stream = plan.execute(p, Arc::clone(context));
            let (index, time) = (Arc::clone(index), time.clone());
            SpawnedTask::spawn(async move {
                let mut stream = stream?;
                let mut sums = index.sums(touched)?;
                while let Some(batch) = stream.next().await {
                    let batch = batch?;
                    let _timer = time.timer();
                    index.add(&batch, &mut sums)?;
                }
                Ok::<_, DataFusionError>(sums)
            })
        })
        .collect();
    let mut total = index.sums(touched)?;
    for task in tasks {
        let sums = task
            .join_unwind()
            .await
            .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
        let _timer = time.timer();
        total.merge(&sums);
    }
    Ok(total)
}
