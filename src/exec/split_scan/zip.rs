//! The columns of several scans of the same rows, side by side.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{internal_datafusion_err, internal_err};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::common::spawn_buffered;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::exec::kit;

/// Batches each input keeps ready ahead of the zip (each input runs on
/// its own task).
const AHEAD: usize = 2;

/// The columns of `inputs` side by side: every input reads the same rows,
/// in the same order and partitions, and gives some of the columns
/// (several scans of one file, each decoding other columns on its own
/// core). Partition `p` pairs the rows of partition `p` of every input by
/// position, so each input must give the same rows in partition `p` in
/// every execution (a file scan whose partitions may take each other's
/// files does not); inputs that end at different rows are an internal
/// error, never a silently shifted row.
pub struct ZipColumnsExec {
    inputs: Vec<Arc<dyn ExecutionPlan>>,
    /// Where each output column comes from: (input, column of that input).
    columns: Arc<[(usize, usize)]>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for ZipColumnsExec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("ZipColumnsExec")
            .field("inputs", &self.inputs.len())
            .field("columns", &self.columns)
            .finish()
    }
}

impl ZipColumnsExec {
    /// `schema`'s columns taken from `inputs` as `columns` says (input,
    /// column of it); the inputs must have the same number of partitions.
    pub fn try_new(
        inputs: Vec<Arc<dyn ExecutionPlan>>,
        columns: Vec<(usize, usize)>,
        schema: SchemaRef,
    ) -> Result<Self> {
        let Some(first) = inputs.first() else {
            return internal_err!("ZipColumnsExec needs an input");
        };
        let partitions = first.output_partitioning().partition_count();
        if inputs
            .iter()
            .any(|i| i.output_partitioning().partition_count() != partitions)
        {
            return internal_err!("ZipColumnsExec's inputs have other partitions");
        }
        if columns.len() != schema.fields().len() {
            return internal_err!("ZipColumnsExec: a source for every column");
        }
        for (field, &(input, column)) in schema.fields().iter().zip(&columns) {
            let from = inputs
                .get(input)
                .and_then(|i| i.schema().fields().get(column).cloned());
            if from.as_deref() != Some(field.as_ref()) {
                return internal_err!(
                    "ZipColumnsExec: column {} is not in its input",
                    field.name()
                );
            }
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            inputs,
            columns: columns.into(),
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

/// One input's stream and the rows of its current batch not yet zipped.
struct Side {
    stream: SendableRecordBatchStream,
    batch: Option<RecordBatch>,
    offset: usize,
}

impl Side {
    /// Rows of the current batch not yet zipped, reading the next non-empty
    /// batch where they are spent (0: the input ended).
    async fn ready(&mut self) -> Result<usize> {
        loop {
            if let Some(batch) = &self.batch {
                if self.offset < batch.num_rows() {
                    return Ok(batch.num_rows() - self.offset);
                }
            }
            match self.stream.next().await.transpose()? {
                Some(batch) => {
                    self.batch = Some(batch);
                    self.offset = 0;
                }
                None => {
                    self.batch = None;
                    return Ok(0);
                }
            }
        }
    }

    /// The next `rows` rows of column `column`.
    fn take(&self, column: usize, rows: usize) -> ArrayRef {
        let batch = self.batch.as_ref().expect("ready before take");
        batch.column(column).slice(self.offset, rows)
    }
}

/// The next zipped batch of `sides` (`None`: every input ended, at the
/// same row).
async fn zip_next(
    sides: &mut [Side],
    columns: &[(usize, usize)],
    schema: &SchemaRef,
) -> Result<Option<RecordBatch>> {
    let mut rows = usize::MAX;
    let mut ended = 0;
    for side in sides.iter_mut() {
        match side.ready().await? {
            0 => ended += 1,
            n => rows = rows.min(n),
        }
    }
    if ended == sides.len() {
        return Ok(None);
    }
    if ended > 0 {
        return Err(internal_datafusion_err!(
            "ZipColumnsExec: its inputs gave different numbers of rows"
        ));
    }
    let arrays = columns
        .iter()
        .map(|&(side, column)| sides[side].take(column, rows))
        .collect();
    for side in sides.iter_mut() {
        side.offset += rows;
    }
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(Some(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        arrays,
        &options,
    )?))
}

impl DisplayAs for ZipColumnsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ZipColumnsExec: inputs={}", self.inputs.len())
    }
}

impl ExecutionPlan for ZipColumnsExec {
    kit::own_properties!();
    kit::own_metrics!();
    // No expressions: columns are taken by position.
    kit::no_expressions!();

    fn name(&self) -> &str {
        "ZipColumnsExec"
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.inputs.iter().collect()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(
            children,
            self.columns.to_vec(),
            self.schema(),
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let sides = self
            .inputs
            .iter()
            .map(|input| {
                let stream = input.execute(partition, Arc::clone(&context))?;
                Ok(Side {
                    stream: spawn_buffered(stream, AHEAD),
                    batch: None,
                    offset: 0,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let columns = Arc::clone(&self.columns);
        let schema = self.schema();
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let state = (sides, columns, Arc::clone(&schema), metrics);
        let stream = futures::stream::try_unfold(state, |mut state| async move {
            let (sides, columns, schema, metrics) = &mut state;
            let batch = zip_next(sides, columns, schema).await?;
            if let Some(batch) = &batch {
                metrics.record_output(batch.num_rows());
            }
            Ok(batch.map(|b| (b, state)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}
