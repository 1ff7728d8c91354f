//! `UPDATE` with a gradient with respect to the table's own rows, executed
//! ([`crate::plan::overwrite`]): [`OverwriteExec`] computes every row of its
//! input, then makes them the contents of the in-memory table.

use std::sync::Arc;

use datafusion::arrow::array::{Array, BooleanArray, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{MemTable, TableProvider};
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};

use super::kit;

/// Computes every row of its input, then makes them the contents of the
/// in-memory table; see the [module docs](self).
#[derive(Debug)]
pub struct OverwriteExec {
    pub(crate) input: Arc<dyn ExecutionPlan>,
    pub(crate) table: Arc<dyn TableProvider>,
    pub(crate) schema: SchemaRef,
    pub(crate) properties: Arc<PlanProperties>,
}

impl OverwriteExec {
    /// The same update over `input`.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Ok(Self {
            input,
            table: Arc::clone(&self.table),
            schema: Arc::clone(&self.schema),
            properties: Arc::clone(&self.properties),
        })
    }
}

kit::display_name!(OverwriteExec);

impl ExecutionPlan for OverwriteExec {
    kit::one_input!("OverwriteExec");
    kit::own_properties!();
    kit::no_expressions!();

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("OverwriteExec has one partition");
        }
        let (input, table, schema) = (
            Arc::clone(&self.input),
            Arc::clone(&self.table),
            Arc::clone(&self.schema),
        );
        let out = Arc::clone(&schema);
        let done = futures::stream::once(async move {
            let rows = collect(input, context).await?;
            let count = replace_contents(table.as_ref(), rows).await?;
            Ok(RecordBatch::try_new(
                out,
                vec![Arc::new(UInt64Array::from(vec![count]))],
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, done)))
    }
}

/// Makes `rows` (the table's columns, then the updated flag) the contents
/// of `table`, spread over its partitions; the number of rows updated.
async fn replace_contents(table: &dyn TableProvider, rows: Vec<RecordBatch>) -> Result<u64> {
    let Some(memory) = table.downcast_ref::<MemTable>() else {
        return internal_err!("OverwriteExec writes an in-memory table");
    };
    let schema = memory.schema();
    let width = schema.fields().len();
    let mut count = 0u64;
    let mut contents = Vec::with_capacity(rows.len());
    for batch in rows {
        let Some(flag) = batch.column(width).as_any().downcast_ref::<BooleanArray>() else {
            return internal_err!("the updated flag is Boolean");
        };
        count += flag.true_count() as u64;
        if batch.num_rows() > 0 {
            contents.push(RecordBatch::try_new(
                Arc::clone(&schema),
                batch.columns()[..width].to_vec(),
            )?);
        }
    }
    let partitions = memory.batches.len();
    if partitions == 0 {
        return internal_err!("an in-memory table has at least one partition");
    }
    let mut spread = vec![Vec::new(); partitions];
    for (i, batch) in contents.into_iter().enumerate() {
        spread[i % partitions].push(batch);
    }
    for (partition, batches) in memory.batches.iter().zip(spread) {
        *partition.write().await = batches;
    }
    memory.sort_order.lock().clear();
    Ok(count)
}
