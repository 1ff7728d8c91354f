//! Gradient results and tensor columns through Arrow's C stream interface,
//! the way the Python package hands tables to pyarrow and takes them from
//! it: nothing of a struct (several partials) or a nested FixedSizeList
//! (a matrix) may be lost or reinterpreted on the way.

use std::sync::Arc;

use arrow::array::{RecordBatch, RecordBatchIterator};
use arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use datafusion::datasource::MemTable;
use datafusion::error::Result;

/// `batches` exported as a C stream and imported back.
fn through_c_stream(batches: Vec<RecordBatch>) -> Vec<RecordBatch> {
    let schema = batches[0].schema();
    let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
    let stream = FFI_ArrowArrayStream::new(Box::new(reader));
    let imported = ArrowArrayStreamReader::try_new(stream).expect("a valid C stream");
    imported.map(|b| b.expect("a batch")).collect()
}

/// Per-row partials (a struct), a matrix, and a matrix-valued gradient.
const QUERY: &str = "SELECT x, grad(x * x * y, x, y) AS g, m, \
       grad(tensor_total(matmul(m, m)) * x, m) AS dm FROM {} ORDER BY x";

#[tokio::test]
async fn gradients_and_tensors_survive_the_c_stream_interface() -> Result<()> {
    let ctx = datafusion_grad::session_context();
    ctx.sql(
        "CREATE TABLE t AS SELECT x, y, tensor([x, y, x * y, 1.0], 2, 2) AS m \
         FROM (VALUES (3.0, 2.0), (1.0, -1.0), (0.5, 4.0)) AS v(x, y)",
    )
    .await?
    .collect()
    .await?;
    let direct = ctx.sql(&QUERY.replace("{}", "t")).await?.collect().await?;
    assert_eq!(direct.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    assert_eq!(direct, through_c_stream(direct.clone()));

    // a table that arrived through the C stream is differentiated like the
    // original
    let rows = through_c_stream(ctx.sql("SELECT * FROM t").await?.collect().await?);
    let table = MemTable::try_new(rows[0].schema(), vec![rows])?;
    ctx.register_table("imported", Arc::new(table))?;
    let imported = ctx
        .sql(&QUERY.replace("{}", "imported"))
        .await?
        .collect()
        .await?;
    assert_eq!(direct, imported);
    Ok(())
}
