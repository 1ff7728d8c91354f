//! The gradient table summed into the parameter rows
//! ([`crate::plan::reverse`]'s group join), executed: [`GroupJoinExec`]
//! builds a hash table (or a dense index, [`super::row_index`]) over the
//! rows' identities and sums every contribution into its row.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::datatypes::Float64Type;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{internal_err, DataFusionError};
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, Time};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream,
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
    pub(crate) schema: SchemaRef,
    pub(crate) properties: Arc<PlanProperties>,
    pub(crate) metrics: ExecutionPlanMetricsSet,
}

kit::display_name!(GroupJoinExec);

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
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let batch_size = context.session_config().batch_size();
        let out = Arc::clone(&schema);
        let output = async move {
            let reservation = MemoryConsumer::new("GroupJoinExec").register(context.memory_pool());
            let rows = concat_batches(&rows.schema(), &collect(rows, Arc::clone(&context)).await?)?;
            reservation.try_grow(rows.get_array_memory_size())?;
            let time = metrics.elapsed_compute().clone();
            let index = {
                let _timer = time.timer();
                let keys = identity
                    .iter()
                    .map(|&i| Arc::clone(rows.column(i)))
                    .collect();
                Arc::new(RowIndex::build(keys, rows.num_rows(), &check, reservation)?)
            };
            let inputs = std::iter::once((contributions, false))
                .chain(scaled.into_iter().map(|s| (s, true)))
                .map(|(plan, touched)| summed(plan, &index, &context, &time, touched));
            let mut sums = try_join_all(inputs).await?.into_iter();
            let mut total = sums.next().expect("the contributions");
            let visible = rows.num_columns() - sums.len();
            for (s, sums) in sums.enumerate() {
                let Some(factors) = rows.column(visible + s).as_primitive_opt::<Float64Type>()
                else {
                    return internal_err!("a group join's factors are doubles");
                };
                let _timer = time.timer();
                for (r, total) in total.values.iter_mut().enumerate() {
                    if sums.is_touched(r) && factors.is_valid(r) {
                        *total += factors.value(r) * sums.values[r];
                    }
                }
            }
            let mut columns = rows.columns()[..visible].to_vec();
            columns
                .push(Arc::new(Float64Array::from(std::mem::take(&mut total.values))) as ArrayRef);
            let all = RecordBatch::try_new(out, columns)?;
            metrics.record_output(all.num_rows());
            metrics.done();
            // Batches of their own, copied as they are read: slices of one
            // large batch each count as all of it in a consumer's memory
            // accounting.
            let batches = (0..all.num_rows())
                .step_by(batch_size.max(1))
                .map(move |start| {
                    let end = all.num_rows().min(start + batch_size);
                    let indices = UInt32Array::from_iter_values(start as u32..end as u32);
                    Ok(take_record_batch(&all, &indices)?)
                });
            Ok::<_, DataFusionError>(futures::stream::iter(batches))
        };
        let stream = futures::stream::once(output).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
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
