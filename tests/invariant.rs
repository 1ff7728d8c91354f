//! Loop-invariant data of recursive queries (`datafusion_grad::exec::loop_invariant`):
//! every loop gives the same rows with the data kept as when it is read in
//! every iteration (`datafusion_grad.cache_loop_invariants = false`), the data
//! side is computed in one iteration only (counted by a function it calls),
//! a pool too small for the data falls back to reading it every iteration, and
//! data that arrives in one partition is spread over the cores.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Float64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::cast::as_float64_array;
use datafusion::error::Result;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::physical_plan::{displayable, ExecutionPlan};
use datafusion::prelude::*;

/// `tick(x)` = `x`, counting the rows it is called on (and `volatile_tick`,
/// the same declared volatile).
#[derive(Debug, PartialEq, Eq, Hash)]
struct Tick {
    signature: Signature,
    name: &'static str,
}

static TICKS: AtomicUsize = AtomicUsize::new(0);

impl ScalarUDFImpl for Tick {
    fn name(&self) -> &str {
        self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let array = args.args[0].to_array(args.number_rows)?;
        TICKS.fetch_add(array.len(), Ordering::SeqCst);
        let values: &Float64Array = as_float64_array(&array)?;
        Ok(ColumnarValue::Array(Arc::new(values.clone()) as ArrayRef))
    }
}

/// Our session with `partitions` target partitions (and a memory pool of
/// `memory` bytes where given), the `tick` function, and the data: `d`, a
/// Parquet file of 40,000 points written as one row group.
async fn session(
    dir: &std::path::Path,
    partitions: usize,
    memory: Option<usize>,
) -> Result<SessionContext> {
    let config = SessionConfig::new().with_target_partitions(partitions);
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(bytes) = memory {
        runtime = runtime.with_memory_limit(bytes, 1.0);
    }
    let ctx = SessionContext::new_with_config_rt(config, runtime.build_arc()?);
    datafusion_grad::register(&ctx);
    for (name, volatility) in [
        ("tick", Volatility::Immutable),
        ("volatile_tick", Volatility::Volatile),
    ] {
        ctx.register_udf(ScalarUDF::new_from_impl(Tick {
            signature: Signature::exact(vec![DataType::Float64], volatility),
            name,
        }));
    }
    let file = dir.join("d.parquet");
    if !file.exists() {
        ctx.sql(&format!(
            "COPY (SELECT CAST(value AS DOUBLE) / 40000.0 - 0.5 AS x,
                          sin(value * 0.37) + 2.0 * (CAST(value AS DOUBLE) / 40000.0) AS y,
                          value % 4 AS g
                   FROM generate_series(1, 40000))
             TO '{}' STORED AS PARQUET OPTIONS ('format.max_row_group_size' '1000000')",
            file.display()
        ))
        .await?
        .collect()
        .await?;
    }
    ctx.register_parquet("d", file.to_str().unwrap(), ParquetReadOptions::default())
        .await?;
    ctx.sql("CREATE TABLE k(g BIGINT, scale DOUBLE) AS VALUES (0, 1.0), (1, 0.5), (2, 2.0)")
        .await?
        .collect()
        .await?;
    Ok(ctx)
}

/// Training loops and other recursions whose recursive terms read `d`, and
/// whether the plan must keep a part of it (`false`: it may, or not: a
/// hash join's dynamic filter on `d`, DataFusion's own hoisting of an
/// uncorrelated subquery).
const LOOPS: &[(&str, bool)] = &[
    // gradient descent, the derivative through the aggregate
    (
        "WITH RECURSIVE fit(step, w, b) AS (
       SELECT 0, 0.0 AS w, 0.0 AS b
       UNION ALL
       SELECT step + 1,
              w - 0.5 * grad(avg(power(w * x + b - y, 2)), w),
              b - 0.5 * grad(avg(power(w * x + b - y, 2)), b)
       FROM fit CROSS JOIN d WHERE step < 12 GROUP BY step, w, b)
     SELECT * FROM fit",
        true,
    ),
    // the data filtered, projected and joined with a table before the loop uses it
    (
        "WITH RECURSIVE fit(step, w) AS (
       SELECT 0, 1.0
       UNION ALL
       SELECT step + 1, w - 0.1 * avg((w * x * scale - y) * x * scale)
       FROM fit CROSS JOIN (SELECT x, y, scale FROM d JOIN k ON d.g = k.g WHERE x > -0.4)
       WHERE step < 8 GROUP BY step, w)
     SELECT * FROM fit",
        true,
    ),
    // a hash join of the work table with the data
    (
        "WITH RECURSIVE s(step, g, v) AS (
       SELECT 0, g, 0.0 FROM k
       UNION ALL
       SELECT s.step + 1, s.g, s.v + sum(d.y) / 1000.0
       FROM s JOIN d ON s.g = d.g WHERE s.step < 5 GROUP BY s.step, s.g, s.v)
     SELECT * FROM s",
        false,
    ),
    // a graph traversal: the edges (the data's rows by group) probed by each
    // iteration's nodes, hashed once (`KeptHashJoinExec`)
    (
        "WITH RECURSIVE reach(node, depth) AS (
       SELECT CAST(1 AS BIGINT) AS node, 0 AS depth
       UNION ALL
       SELECT e.dst, r.depth + 1
       FROM reach r JOIN (SELECT DISTINCT g AS src, (g + 1) % 4 AS dst FROM d) e
         ON e.src = r.node
       WHERE r.depth < 7)
     SELECT node, depth, count(*) FROM reach GROUP BY node, depth",
        false,
    ),
    // the work table's rows kept where no data row matches (a left join
    // with the data on the right: the data side becomes the build side),
    // a NULL key among them (`=` matches it to nothing)
    (
        "WITH RECURSIVE s(step, g, v) AS (
       SELECT 0, CASE WHEN g = 1 THEN NULL ELSE g END, 1.0 FROM k
       UNION ALL
       SELECT s.step + 1, s.g, s.v + coalesce(t.y, -1.0)
       FROM s LEFT JOIN (SELECT g, max(y) AS y FROM d WHERE g < 2 GROUP BY g) t ON s.g = t.g
       WHERE s.step < 5)
     SELECT * FROM s",
        false,
    ),
    // the data's rows kept where no work-table row matches (a left join with
    // the data on the left: its build side marks rows, not kept)
    (
        "WITH RECURSIVE s(step, g, v) AS (
       SELECT 0 AS step, CAST(0 AS BIGINT) AS g, 1.0 AS v
       UNION ALL
       SELECT max(s.step) + 1, CAST(0 AS BIGINT), sum(coalesce(s.v, 0.5) * k.scale)
       FROM k LEFT JOIN s ON k.g = s.g
       HAVING max(s.step) < 4)
     SELECT * FROM s",
        false,
    ),
    // NULL keys: `IS NOT DISTINCT FROM` matches NULL to NULL
    (
        "WITH RECURSIVE s(step, g, v) AS (
       SELECT 0 AS step, CASE WHEN g = 0 THEN NULL ELSE g END AS g, 1.0 AS v FROM k
       UNION ALL
       SELECT s.step + 1, s.g, s.v + t.y
       FROM s JOIN (SELECT CASE WHEN g = 0 THEN NULL ELSE g END AS g, max(y) AS y FROM d GROUP BY 1) t
         ON s.g IS NOT DISTINCT FROM t.g
       WHERE s.step < 4)
     SELECT step, coalesce(g, -1), v FROM s",
        false,
    ),
    // semi and anti joins of the work table with the data
    (
        "WITH RECURSIVE s(step, g) AS (
       SELECT 0, g FROM k
       UNION ALL
       SELECT step + 1, (g + 1) % 5 FROM s
       WHERE step < 6 AND g IN (SELECT g FROM d WHERE x > 0.2)
         AND NOT EXISTS (SELECT 1 FROM d WHERE d.g = s.g AND d.x > 0.49995))
     SELECT * FROM s",
        false,
    ),
    // the work table read twice (our own iteration, `IterateExec`)
    (
        "WITH RECURSIVE fit(step, w) AS (
       SELECT 0, 0.0 AS w
       UNION ALL
       SELECT step + 1, w - 0.5 * avg((w * x - y) * x) - 0.01 * (SELECT max(w) FROM fit)
       FROM fit CROSS JOIN d WHERE step < 6 GROUP BY step, w)
     SELECT * FROM fit",
        true,
    ),
    // a scalar subquery over the data in the recursive term
    (
        "WITH RECURSIVE s(step, v) AS (
       SELECT 0, 0.0
       UNION ALL
       SELECT step + 1, v + (SELECT max(y) FROM d WHERE x < 0.1) FROM s WHERE step < 6)
     SELECT * FROM s",
        false,
    ),
];

/// The rows of `sql` in `ctx` as numbers, sorted.
async fn rows(ctx: &SessionContext, sql: &str) -> Result<Vec<Vec<f64>>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let mut rows = Vec::new();
    for batch in batches {
        for r in 0..batch.num_rows() {
            let row = (0..batch.num_columns())
                .map(|c| {
                    let column =
                        datafusion::arrow::compute::cast(batch.column(c), &DataType::Float64)?;
                    let column = as_float64_array(&column)?.clone();
                    Ok(column.value(r))
                })
                .collect::<Result<Vec<f64>>>()?;
            rows.push(row);
        }
    }
    rows.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(rows)
}

/// The physical plan of `sql` in `ctx`, as EXPLAIN prints it.
async fn plan(ctx: &SessionContext, sql: &str) -> Result<String> {
    let plan: Arc<dyn ExecutionPlan> = ctx.sql(sql).await?.create_physical_plan().await?;
    let shown = displayable(plan.as_ref()).indent(false).to_string();
    Ok(shown)
}

fn close(a: &[Vec<f64>], b: &[Vec<f64>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(r, s)| {
            r.iter()
                .zip(s)
                .all(|(x, y)| (x - y).abs() <= 1e-12 * x.abs().max(y.abs()).max(1.0))
        })
}

async fn set_kept(ctx: &SessionContext, kept: bool) -> Result<()> {
    ctx.sql(&format!(
        "SET datafusion_grad.cache_loop_invariants = {kept}"
    ))
    .await?
    .collect()
    .await?;
    Ok(())
}

#[tokio::test]
async fn every_loop_gives_the_same_rows_with_its_data_kept() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // 2 partitions: the file (one row group) is also split between them
    for partitions in [1, 2, 4] {
        let ctx = session(dir.path(), partitions, None).await?;
        for &(sql, must_keep) in LOOPS {
            set_kept(&ctx, false).await?;
            let read = rows(&ctx, sql).await?;
            assert!(
                !plan(&ctx, sql).await?.contains("LoopInvariantExec"),
                "{sql}"
            );
            set_kept(&ctx, true).await?;
            let kept = rows(&ctx, sql).await?;
            let shown = plan(&ctx, sql).await?;
            assert!(!must_keep || shown.contains("LoopInvariantExec"), "{shown}");
            assert!(close(&read, &kept), "{sql}\n{read:?}\n{kept:?}");
            assert!(read.len() > 3, "{sql}");
        }
    }
    Ok(())
}

/// The hash join of a graph traversal over the data: `KeptHashJoinExec`
/// builds its hash table over the edges once (its build side's rows,
/// counted over all iterations, are the edges' once), and the rows are
/// those of DataFusion's join built in every iteration.
#[tokio::test]
async fn a_join_with_the_data_builds_its_hash_table_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ctx = session(dir.path(), 2, None).await?;
    let traversal = "WITH RECURSIVE reach(node, depth) AS (
         SELECT CAST(0 AS BIGINT) AS node, 0 AS depth
         UNION ALL
         SELECT e.dst, r.depth + 1
         FROM reach r JOIN (SELECT DISTINCT g AS src, (g + 1) % 4 AS dst FROM d WHERE x < -0.4998) e
           ON e.src = r.node
         WHERE r.depth < 30)
       SELECT count(*), sum(node), max(depth) FROM reach";
    let analyzed = ctx
        .sql(&format!("EXPLAIN ANALYZE {traversal}"))
        .await?
        .collect()
        .await?;
    let shown = datafusion::arrow::util::pretty::pretty_format_batches(&analyzed)?.to_string();
    let join = shown
        .lines()
        .find(|l| l.contains("KeptHashJoinExec: mode=CollectLeft"))
        .unwrap_or_else(|| panic!("{shown}"));
    // 4 edges (of the first 7 rows), built once, not 30 times
    assert!(join.contains("build_input_rows=4,"), "{join}");
    let kept = rows(&ctx, traversal).await?;
    set_kept(&ctx, false).await?;
    assert!(!plan(&ctx, traversal).await?.contains("KeptHashJoinExec"));
    let rebuilt = rows(&ctx, traversal).await?;
    // 1 + 30 * 1 nodes: each node has one out-edge
    assert_eq!(kept, vec![vec![31.0, 45.0, 30.0]]);
    assert_eq!(kept, rebuilt);
    Ok(())
}

/// Sum of `tick` calls made while `sql` runs in `ctx`.
async fn ticks(ctx: &SessionContext, sql: &str) -> Result<(usize, Vec<Vec<f64>>)> {
    let before = TICKS.load(Ordering::SeqCst);
    let rows = rows(ctx, sql).await?;
    Ok((TICKS.load(Ordering::SeqCst) - before, rows))
}

const TICKING: &str = "WITH RECURSIVE fit(step, w) AS (
       SELECT 0, 0.0
       UNION ALL
       SELECT step + 1, w - 0.5 * grad(avg(power(w * tx - y, 2)), w)
       FROM fit CROSS JOIN (SELECT tick(x) AS tx, y FROM d) WHERE step < 10
       GROUP BY step, w)
     SELECT * FROM fit";

#[tokio::test]
async fn the_data_side_is_computed_in_one_iteration() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ctx = session(dir.path(), 2, None).await?;
    // One test at a time counts: the counter is shared by the test binary.
    let _lock = COUNTING.lock().await;
    let (kept_ticks, kept) = ticks(&ctx, TICKING).await?;
    set_kept(&ctx, false).await?;
    let (read_ticks, read) = ticks(&ctx, TICKING).await?;
    assert_eq!(kept_ticks, 40_000);
    // the recursive term runs 11 times (the last one ends the recursion)
    assert_eq!(read_ticks, 11 * 40_000);
    assert!(close(&kept, &read));
    Ok(())
}

#[tokio::test]
async fn data_too_large_for_the_memory_pool_is_read_in_every_iteration() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let unbounded = session(dir.path(), 2, None).await?;
    // 40,000 rows of two doubles (640 kB kept) do not fit in 256 kB.
    let small = session(dir.path(), 2, Some(256 * 1024)).await?;
    let _lock = COUNTING.lock().await;
    let (small_ticks, in_small) = ticks(&small, TICKING).await?;
    let (_, expected) = ticks(&unbounded, TICKING).await?;
    // every iteration computes it (the first one also the part it
    // collected before the pool ran out)
    assert!(
        (11 * 40_000..12 * 40_000).contains(&small_ticks),
        "{small_ticks}"
    );
    assert!(close(&in_small, &expected));
    Ok(())
}

#[tokio::test]
async fn a_volatile_data_side_is_computed_in_every_iteration() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ctx = session(dir.path(), 2, None).await?;
    let sql = "WITH RECURSIVE s(step, v) AS (
         SELECT 0, 0.0
         UNION ALL
         SELECT step + 1, max(r) FROM s CROSS JOIN (SELECT x + random() AS r FROM d)
         WHERE step < 4 GROUP BY step)
       SELECT count(DISTINCT v) FROM s WHERE step > 0";
    // four draws, not one replayed (the file's scan below may be kept)
    assert_eq!(rows(&ctx, sql).await?, vec![vec![4.0]]);
    let _lock = COUNTING.lock().await;
    let volatile = TICKING.replace("tick(x)", "volatile_tick(x)");
    let (count, _) = ticks(&ctx, &volatile).await?;
    assert_eq!(count, 11 * 40_000);
    Ok(())
}

#[tokio::test]
async fn data_in_one_partition_is_spread_over_the_cores() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ctx = session(dir.path(), 4, None).await?;
    let shown = plan(&ctx, LOOPS[0].0).await?;
    assert!(shown.contains("LoopInvariantExec: partitions=4"), "{shown}");
    Ok(())
}

/// The file, of one row group, is read by both cores: a scan each, of
/// other columns, zipped back into rows (DataFusion reads a row group in
/// one partition).
#[tokio::test]
async fn a_file_of_one_row_group_is_read_by_every_core() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ctx = session(dir.path(), 2, None).await?;
    let shown = plan(&ctx, LOOPS[0].0).await?;
    assert!(shown.contains("ZipColumnsExec: inputs=2"), "{shown}");
    assert!(
        shown.contains("projection=[x]") && shown.contains("projection=[y]"),
        "{shown}"
    );
    // not kept: DataFusion's scan (one group for this small file)
    set_kept(&ctx, false).await?;
    let shown = plan(&ctx, LOOPS[0].0).await?;
    assert!(!shown.contains("ZipColumnsExec"), "{shown}");
    Ok(())
}

/// More cores than columns: each column's scan is also split into shares
/// of rows, and the rows (in their order) are those of the file read
/// whole; one column alone is split into shares of rows only; a column
/// the table declares of another type than the file's (widened by
/// DataFusion's scan) is read as the table says.
#[tokio::test]
async fn more_cores_than_columns_read_shares_of_rows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ctx = session(dir.path(), 4, None).await?;
    let file = dir.path().join("big.parquet");
    // 70,000 rows: two batches per core at 4 cores; batches of 8192 and
    // 1000-row pages so the shares start inside pages
    ctx.sql(&format!(
        "COPY (SELECT CAST(value AS DOUBLE) / 70000.0 AS x,
                      cos(value * 0.11) AS y, CAST(value AS INT) AS i,
                      CAST(value * 3 AS VARCHAR) AS t
               FROM generate_series(1, 70000))
         TO '{}' STORED AS PARQUET OPTIONS ('format.max_row_group_size' '1000000',
                                            'format.data_page_row_count_limit' '1000')",
        file.display()
    ))
    .await?
    .collect()
    .await?;
    ctx.register_parquet("big", file.to_str().unwrap(), ParquetReadOptions::default())
        .await?;
    let wide = Schema::new(vec![
        Field::new("x", DataType::Float64, true),
        Field::new("y", DataType::Float64, true),
        Field::new("i", DataType::Int64, true),
        Field::new("t", DataType::Utf8, true),
    ]);
    let options = ParquetReadOptions::default().schema(&wide);
    ctx.register_parquet("big64", file.to_str().unwrap(), options)
        .await?;
    // every row of the data, in the order the loop's last step read them
    let sql = "WITH RECURSIVE r(step, s) AS (
           SELECT 0, 0.0
           UNION ALL
           SELECT step + 1, s + sum(x * y + i) FILTER (WHERE i % 7 = step)
           FROM r CROSS JOIN big WHERE step < 6 GROUP BY step, s)
         SELECT * FROM r ORDER BY step";
    let one_column = "WITH RECURSIVE r(step, s) AS (
           SELECT 0, 0.0
           UNION ALL
           SELECT step + 1, s + sum(y) FROM r CROSS JOIN (SELECT y FROM big)
           WHERE step < 4 GROUP BY step, s)
         SELECT * FROM r ORDER BY step";
    let strings = "WITH RECURSIVE r(step, s) AS (
           SELECT 0, 0.0
           UNION ALL
           SELECT step + 1, s + sum(x * (length(t) + i)) FILTER (WHERE i % 5 = step)
           FROM r CROSS JOIN big64 WHERE step < 5 GROUP BY step, s)
         SELECT * FROM r ORDER BY step";
    set_kept(&ctx, false).await?;
    let read = rows(&ctx, sql).await?;
    let read_one = rows(&ctx, one_column).await?;
    let read_strings = rows(&ctx, strings).await?;
    set_kept(&ctx, true).await?;
    let shown = plan(&ctx, sql).await?;
    // three columns on four cores: two groups of columns, two shares each
    assert!(shown.contains("ZipColumnsExec: inputs=2"), "{shown}");
    assert_eq!(shown.matches("file_groups={2 groups").count(), 2, "{shown}");
    assert!(close(&read, &rows(&ctx, sql).await?), "{read:?}");
    let shown = plan(&ctx, one_column).await?;
    assert!(
        !shown.contains("ZipColumnsExec") && shown.contains("file_groups={4 groups"),
        "{shown}"
    );
    assert!(close(&read_one, &rows(&ctx, one_column).await?));
    let shown = plan(&ctx, strings).await?;
    assert!(
        shown.contains("ZipColumnsExec: inputs=2") && shown.contains("file_groups={2 groups"),
        "{shown}"
    );
    assert!(close(&read_strings, &rows(&ctx, strings).await?));
    // a filter on the data, pushed into the scans (pruning; with
    // pushdown_filters also filtering rows in the reader): the same rows
    let filtered = "WITH RECURSIVE r(step, s) AS (
           SELECT 0, 0.0
           UNION ALL
           SELECT step + 1, s + sum(x * y + i) FILTER (WHERE i % 3 = step)
           FROM r CROSS JOIN (SELECT * FROM big WHERE y > 0.3 AND i % 11 <> 4)
           WHERE step < 3 GROUP BY step, s)
         SELECT * FROM r ORDER BY step";
    for pushdown in [false, true] {
        ctx.sql(&format!(
            "SET datafusion.execution.parquet.pushdown_filters = {pushdown}"
        ))
        .await?
        .collect()
        .await?;
        set_kept(&ctx, false).await?;
        let read = rows(&ctx, filtered).await?;
        set_kept(&ctx, true).await?;
        let shown = plan(&ctx, filtered).await?;
        assert!(
            shown.contains("ZipColumnsExec") && shown.contains("predicate="),
            "{shown}"
        );
        assert!(close(&read, &rows(&ctx, filtered).await?), "{read:?}");
        assert!(read.len() == 4 && read[3][1] != 0.0, "{read:?}");
    }
    Ok(())
}

/// Many cores, few columns: every column group is read in eight shares of
/// rows, and each share's rows meet the same rows of the other group
/// (DataFusion's scans may hand a file to whichever partition is idle;
/// the split's scans must not). Exact sums of integers: a row paired with
/// another row's column changes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shares_of_rows_pair_the_same_rows_in_every_column_group() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ctx = session(dir.path(), 16, None).await?;
    let file = dir.path().join("pairs.parquet");
    // two batches per core at 16 cores
    ctx.sql(&format!(
        "COPY (SELECT CAST(value AS DOUBLE) AS a, CAST(value % 1009 AS DOUBLE) AS b
               FROM generate_series(1, 300000))
         TO '{}' STORED AS PARQUET OPTIONS ('format.max_row_group_size' '1000000')",
        file.display()
    ))
    .await?
    .collect()
    .await?;
    ctx.register_parquet(
        "pairs",
        file.to_str().unwrap(),
        ParquetReadOptions::default(),
    )
    .await?;
    let expected = rows(&ctx, "SELECT sum(a * b) FROM pairs").await?[0][0];
    let sql = "WITH RECURSIVE r(step, s) AS (
           SELECT 0, 0.0
           UNION ALL
           SELECT step + 1, sum(a * b) FROM r CROSS JOIN pairs WHERE step < 2 GROUP BY step)
         SELECT s FROM r WHERE step = 2";
    let shown = plan(&ctx, sql).await?;
    assert!(
        shown.contains("ZipColumnsExec: inputs=2") && shown.contains("file_groups={8 groups"),
        "{shown}"
    );
    // each partition of a column group's scan reads its own share
    assert_eq!(
        shown
            .matches("output_partitioning=UnknownPartitioning(8)")
            .count(),
        2,
        "{shown}"
    );
    for _ in 0..8 {
        assert_eq!(rows(&ctx, sql).await?, vec![vec![expected]]);
    }
    Ok(())
}

/// Serializes the tests that count `tick` calls.
static COUNTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A relational training loop: a linear model's weights are the loop's rows,
/// its prediction a contraction of the data (`x`, through `tick`) with
/// them. The contraction of the backward pass lists the data once for all
/// iterations (`kept: true`), and the forward pass, a shared subplan that
/// the backward pass reads again, keeps the data's rows too: the data is
/// computed as often in 12 steps as in 4. The weights are those of the
/// loop that reads the data in every iteration, and of the join +
/// aggregate without the operator.
#[tokio::test]
async fn a_contraction_with_the_data_lists_it_once() -> Result<()> {
    let _lock = COUNTING.lock().await;
    let dir = tempfile::tempdir()?;
    let ctx = session(dir.path(), 2, None).await?;
    for setup in [
        "CREATE TABLE lx AS SELECT n, k, sin(n * 0.3 + k * 1.7) AS v
         FROM (SELECT value / 4 AS n, value % 4 AS k FROM generate_series(0, 399))",
        "CREATE TABLE ly AS SELECT value AS n, cos(value * 0.11) AS t FROM generate_series(0, 99)",
    ] {
        ctx.sql(setup).await?.collect().await?;
    }
    let training = |steps: usize| {
        format!(
            "WITH RECURSIVE train(step, k, w) AS (
               SELECT 0, value, 0.1 * value FROM generate_series(0, 3)
               UNION ALL
               SELECT step + 1, k, w - 0.002 * grad((
                 SELECT sum((p.s - ly.t) * (p.s - ly.t)) FROM
                   (SELECT x.n, sum(x.v * q.w) AS s
                    FROM (SELECT n, k, tick(v) AS v FROM lx) x
                    JOIN train q ON q.k = x.k GROUP BY x.n) p
                   JOIN ly ON ly.n = p.n), w)
               FROM train WHERE step < {steps})
             SELECT step, k, w FROM train ORDER BY step, k"
        )
    };
    let shown = plan(&ctx, &training(4)).await?;
    assert!(
        shown
            .lines()
            .any(|l| l.contains("ContractionExec") && l.contains("kept: true")),
        "{shown}"
    );
    let (four, _) = ticks(&ctx, &training(4)).await?;
    let (twelve, kept) = ticks(&ctx, &training(12)).await?;
    assert_eq!(four, twelve);
    assert_eq!(kept.len(), 4 * 13);
    set_kept(&ctx, false).await?;
    let (read_ticks, read) = ticks(&ctx, &training(12)).await?;
    assert!(read_ticks >= 12 * 400, "{read_ticks}");
    assert!(close(&read, &kept), "{read:?}\n{kept:?}");
    set_kept(&ctx, true).await?;
    ctx.sql("SET datafusion_grad.contraction = false")
        .await?
        .collect()
        .await?;
    let joined = rows(&ctx, &training(12)).await?;
    assert!(close(&joined, &kept), "{joined:?}\n{kept:?}");
    // the weights moved
    assert!((kept[51][2] - kept[3][2]).abs() > 1e-3, "{kept:?}");
    Ok(())
}
