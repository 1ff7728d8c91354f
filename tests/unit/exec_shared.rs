//! Unit tests of `src/exec/shared.rs`: a shared input computed once, or by
//! each occurrence where it does not fit in the memory pool.

use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::{collect, ExecutionPlan};
use datafusion_grad::exec::shared::{Cache, SharedExec};

/// Two occurrences of one input over `context`: each one's rows, and
/// whether the cache kept them.
async fn both(context: TaskContext) -> Result<(Vec<usize>, bool)> {
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Float64, false)]));
    let values = Float64Array::from_iter_values((0..1000).map(f64::from));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)])?;
    let input: Arc<dyn ExecutionPlan> =
        MemorySourceConfig::try_new_exec(&[vec![batch.clone()], vec![batch]], schema, None)?;
    let cache = Arc::new(Cache::default());
    let context = Arc::new(context);
    let mut rows = Vec::new();
    for _ in 0..2 {
        let exec = Arc::new(SharedExec::new(Arc::clone(&input), Arc::clone(&cache)));
        let batches = collect(exec, Arc::clone(&context)).await?;
        rows.push(batches.iter().map(RecordBatch::num_rows).sum());
    }
    let kept = cache.kept().await?.expect("computed");
    Ok((rows, kept))
}

#[tokio::test]
async fn every_occurrence_reads_the_input_computed_once() -> Result<()> {
    let (rows, kept) = both(TaskContext::default()).await?;
    assert_eq!(rows, [2000, 2000]);
    assert!(kept);
    Ok(())
}

#[tokio::test]
async fn an_input_too_large_for_the_memory_pool_is_computed_by_each_occurrence() -> Result<()> {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(1024, 1.0)
        .build_arc()?;
    let (rows, kept) = both(TaskContext::default().with_runtime(runtime)).await?;
    assert_eq!(rows, [2000, 2000]);
    assert!(!kept);
    Ok(())
}
