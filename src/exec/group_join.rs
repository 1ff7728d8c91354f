//! The gradient table summed into the parameter rows
//! ([`crate::plan::reverse`]'s group join), executed: [`GroupJoinExec`]
//! builds a hash table (or a dense index, [`super::row_index`]) over the
//! rows' identities and sums every contribution into its row.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{internal_err, DataFusionError};
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect, ExecutionPlan, ExecutionPlanProperties, PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use super::kit;
use super::row_index::{Duplicate, RowIndex};

/// Sums the contributions into the parameter rows through a hash table
/// over the rows' identities; see the [module docs](self).
#[derive(Debug)]
pub struct GroupJoinExec {
    pub(crate) rows: Arc<dyn ExecutionPlan>,
    pub(crate) contributions: Arc<dyn ExecutionPlan>,
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

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.rows, &self.contributions]
    }

    /// Every input partition is read here, each on its own task: a
    /// repartitioning in front would only copy rows.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match <[_; 2]>::try_from(children) {
            Ok([rows, contributions]) => Ok(Arc::new(Self {
                rows,
                contributions,
                duplicate: Arc::clone(&self.duplicate),
                identity: self.identity.clone(),
                schema: Arc::clone(&self.schema),
                properties: Arc::clone(&self.properties),
                metrics: ExecutionPlanMetricsSet::new(),
            })),
            Err(_) => internal_err!("GroupJoinExec has two children"),
        }
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
            let tasks: Vec<_> = (0..contributions.output_partitioning().partition_count())
                .map(|p| {
                    let stream = contributions.execute(p, Arc::clone(&context));
                    let (index, time) = (Arc::clone(&index), time.clone());
                    SpawnedTask::spawn(async move {
                        let mut stream = stream?;
                        let mut sums = index.sums()?;
                        while let Some(batch) = stream.next().await {
                            let _timer = time.timer();
                            index.add(&batch?, &mut sums.values)?;
                        }
                        Ok::<_, DataFusionError>(sums)
                    })
                })
                .collect();
            let mut total = index.sums()?;
            for task in tasks {
                let sums = task
                    .join_unwind()
                    .await
                    .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
                let _timer = time.timer();
                total
                    .values
                    .iter_mut()
                    .zip(&sums.values)
                    .for_each(|(t, s)| *t += s);
            }
            let mut columns = rows.columns().to_vec();
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
