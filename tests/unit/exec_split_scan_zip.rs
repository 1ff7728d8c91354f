//! Unit tests of `src/exec/split_scan/zip.rs`: the columns of several
//! scans of the same rows, side by side.

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::physical_plan::common::collect;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_grad::exec::split_scan::zip::ZipColumnsExec;

/// A one-partition input of column `name` holding `0..rows`, in
/// batches of `sizes` rows (repeated).
fn input(name: &str, rows: i64, sizes: &[i64]) -> Arc<dyn ExecutionPlan> {
    let schema = Arc::new(Schema::new(vec![Field::new(name, DataType::Int64, false)]));
    let mut batches = Vec::new();
    let mut start = 0;
    for &size in sizes.iter().cycle() {
        if start >= rows {
            break;
        }
        let end = (start + size).min(rows);
        let values = Int64Array::from_iter_values(start..end);
        batches.push(RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)]).unwrap());
        start = end;
    }
    MemorySourceConfig::try_new_exec(&[batches], schema, None).unwrap()
}

fn zip(a: Arc<dyn ExecutionPlan>, b: Arc<dyn ExecutionPlan>) -> ZipColumnsExec {
    let schema = Arc::new(Schema::new(vec![
        b.schema().field(0).clone(),
        a.schema().field(0).clone(),
    ]));
    ZipColumnsExec::try_new(vec![a, b], vec![(1, 0), (0, 0)], schema).unwrap()
}

#[tokio::test]
async fn pairs_rows_by_position_across_batch_boundaries() -> Result<()> {
    let zip = zip(input("a", 1000, &[7, 300]), input("b", 1000, &[64]));
    let batches = collect(zip.execute(0, SessionContext::new().task_ctx())?).await?;
    let mut rows = 0;
    for batch in &batches {
        assert_eq!(batch.schema().field(0).name(), "b");
        let b = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let a = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(a.values(), b.values());
        rows += batch.num_rows();
    }
    assert_eq!(rows, 1000);
    Ok(())
}

#[tokio::test]
async fn inputs_of_other_lengths_are_an_error() {
    let zip = zip(input("a", 1000, &[100]), input("b", 999, &[100]));
    let stream = zip.execute(0, SessionContext::new().task_ctx()).unwrap();
    let error = collect(stream).await.unwrap_err().to_string();
    assert!(error.contains("different numbers of rows"), "{error}");
}
