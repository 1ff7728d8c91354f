//! Gradient queries on Apache Ballista (feature `ballista`), on loopback:
//! an in-process standalone cluster, and a `dfgrad-scheduler` with two
//! `dfgrad-executor` processes. Every result is compared with the local
//! engine's on the same partitioned Parquet data.

#![cfg(feature = "ballista")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, AsArray, Float64Array, Int64Array};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::{collect, displayable};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_grad::ballista::codec::GradPhysicalCodec;
use datafusion_grad::ballista::keep::KeepOnExecutors;
use datafusion_grad::ballista::kept::kept_stats;
use datafusion_grad::options::GradOptions;
use datafusion_grad::{ErrorKind, GradError};
use datafusion_proto::physical_plan::AsExecutionPlan;
use datafusion_proto::protobuf::PhysicalPlanNode;

/// Rows per Parquet file, and files.
const ROWS: i64 = 25_000;
const FILES: i64 = 4;

/// Writes `FILES` Parquet files of points on y = 2.5x - 0.7 plus
/// deterministic noise into `dir`.
async fn write_points(dir: &Path) -> Result<()> {
    let ctx = SessionContext::new();
    for f in 0..FILES {
        let path = dir.join(format!("part-{f}.parquet"));
        ctx.sql(&format!(
            "COPY (SELECT x, 2.5 * x - 0.7 + 0.05 * sin(i * 12.9898) AS y, i \
             FROM (SELECT value AS i, CAST(value % 1000 AS DOUBLE) / 500.0 - 1.0 AS x \
                   FROM generate_series({}, {}))) TO '{}' STORED AS PARQUET",
            f * ROWS + 1,
            (f + 1) * ROWS,
            path.display()
        ))
        .await?
        .collect()
        .await?;
    }
    Ok(())
}

async fn register(ctx: &SessionContext, dir: &Path) -> Result<()> {
    ctx.register_parquet(
        "t",
        format!("{}/", dir.display()),
        ParquetReadOptions::default(),
    )
    .await
}

async fn rows(ctx: &SessionContext, sql: &str) -> Result<RecordBatch> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let schema = batches.first().map(|b| b.schema()).ok_or_else(|| {
        datafusion::error::DataFusionError::Internal(format!("no batches: {sql}"))
    })?;
    Ok(concat_batches(&schema, &batches)?)
}

/// Asserts two results are equal, floats to 1e-9 relative (partitions are
/// summed in different orders).
fn assert_same(sql: &str, local: &RecordBatch, remote: &RecordBatch) {
    assert_eq!(local.num_rows(), remote.num_rows(), "{sql}");
    assert_eq!(local.num_columns(), remote.num_columns(), "{sql}");
    for c in 0..local.num_columns() {
        let (l, r) = (local.column(c), remote.column(c));
        if let (Some(l), Some(r)) = (
            l.as_any().downcast_ref::<Float64Array>(),
            r.as_any().downcast_ref::<Float64Array>(),
        ) {
            for i in 0..l.len() {
                assert_eq!(l.is_null(i), r.is_null(i), "{sql}: column {c} row {i}");
                let (a, b) = (l.value(i), r.value(i));
                assert!(
                    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0),
                    "{sql}: column {c} row {i}: local {a}, ballista {b}"
                );
            }
        } else {
            assert_eq!(l.to_data(), r.to_data(), "{sql}: column {c}");
        }
    }
}

/// The value of each data row's y to the relational loop's final loss
/// (relational reverse mode through it): run locally, refused on Ballista.
const RELATIONAL_VALUATION: &str = "WITH RECURSIVE train(step, k, w) AS ( \
       SELECT 0 AS step, k, CAST(0.0 AS DOUBLE) AS w FROM (VALUES (0), (1), (2)) AS v(k) \
       UNION ALL \
       SELECT step + 1, k, w - 0.3 * grad((SELECT avg(power(p.w * t.x - t.y, 2)) \
                                          FROM t JOIN train p ON p.k = t.i % 3), w) \
       FROM train WHERE step < 4), \
     loss AS (SELECT sum(power(w - 1.0, 2)) AS loss FROM train WHERE step = 4) \
     SELECT count(*) AS n, sum(g) AS s, sum(abs(g)) AS a \
     FROM (SELECT grad((SELECT loss FROM loss), t.y) AS g FROM t) q";

/// The queries run on both engines.
const QUERIES: &[&str] = &[
    // per-row derivatives
    "SELECT x, y, grad(sin(x) * y + x * x, x) AS d, jvp(exp(x) * y, x, 2.0, y, 0.5) AS j \
     FROM t ORDER BY i LIMIT 100",
    // several partials in one sweep, summed over every partition
    "SELECT sum(grad(exp(x) * y, x, y)['x']) AS gx, sum(grad(exp(x) * y, x, y)['y']) AS gy FROM t",
    // gradient of an aggregate over many partitions
    "SELECT w, grad(avg((w * x - y) * (w * x - y)), w) AS g \
     FROM t CROSS JOIN (VALUES (0.5), (1.5), (2.5)) AS p(w) GROUP BY w ORDER BY w",
    // tensor functions on the executors (and DataFusion's make_array)
    "SELECT sum(dot(tensor([x, y], 2), tensor([1.0, 2.0], 2))) AS s, \
            sum(grad(tensor_total(scale(tensor([1.0, 2.0], 2), x * y)), x)) AS ds \
     FROM t",
    // a recursive CTE training loop (iterated by the client on Ballista)
    "WITH RECURSIVE fit(step, w, b) AS ( \
       SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b \
       UNION ALL \
       SELECT step + 1, \
              w - 0.5 * grad(avg(power(w * x + b - y, 2)), w), \
              b - 0.5 * grad(avg(power(w * x + b - y, 2)), b) \
       FROM fit CROSS JOIN t WHERE step < 10 GROUP BY step, w, b) \
     SELECT step, w, b FROM fit ORDER BY step",
    // recursive UNION (duplicates dropped across iterations), and a work
    // table joined with another relation
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION SELECT n % 7 + 1 FROM r) SELECT n FROM r ORDER BY n",
    "WITH RECURSIVE r(n, m) AS (SELECT 1 AS n, 1 AS m UNION ALL \
       SELECT r.n + 1, r.m + c.k FROM r JOIN (VALUES (1, 10), (2, 20), (3, 30)) AS c(n, k) ON r.n = c.n) \
     SELECT n, m FROM r ORDER BY n",
    // relational reverse mode: the gradient with respect to every row of a
    // parameter relation, through a join with the partitioned data and AVG
    "WITH p(k, w) AS (VALUES (0, 0.5), (1, 1.5), (2, 2.5), (3, 9.0)), \
          s AS (SELECT avg(power(p.w * t.x - t.y, 2)) AS loss FROM t JOIN p ON p.k = t.i % 3) \
     SELECT k, grad((SELECT loss FROM s), p.w) AS g FROM p ORDER BY k",
    // ... and a training loop of it in one recursive query: the loss reads
    // the work table (driven by the client, one distributed query a step)
    "WITH RECURSIVE train(step, k, w) AS ( \
       SELECT 0 AS step, k, CAST(0.0 AS DOUBLE) AS w FROM (VALUES (0), (1), (2)) AS v(k) \
       UNION ALL \
       SELECT step + 1, k, w - 0.3 * grad((SELECT avg(power(p.w * t.x - t.y, 2)) \
                                          FROM t JOIN train p ON p.k = t.i % 3), w) \
       FROM train WHERE step < 4) \
     SELECT step, k, w FROM train ORDER BY step, k",
    // a derivative through the iterations of a training loop over the
    // partitioned data (forward mode: tangent columns in the work table)
    "WITH RECURSIVE p(step, w, lr) AS ( \
       SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.5 AS DOUBLE) AS lr \
       UNION ALL \
       SELECT p.step + 1, p.w - p.lr * avg(grad(power(p.w * t.x - t.y, 2), p.w)), p.lr \
       FROM p CROSS JOIN t WHERE p.step < 3 GROUP BY p.step, p.w, p.lr) \
     SELECT w, grad(power(w - 2.5, 2), lr) AS g FROM p WHERE step = 3",
    // reverse mode through the iterations: a tensor state per data row,
    // replayed on the client after the loop ran on the cluster
    "WITH RECURSIVE s(step, i, v, v0) AS ( \
       SELECT 0 AS step, i, v0 AS v, v0 FROM (SELECT i, tensor([x, y], 2) AS v0 FROM t WHERE i <= 4) d \
       UNION ALL \
       SELECT step + 1, i, tensor_add(v, scale(tensor_tanh(v), 0.1)), v0 FROM s WHERE step < 5) \
     SELECT i, grad(tensor_total(tensor_mul(v, v)), v0) AS g FROM s WHERE step = 5 ORDER BY i",
    // a recursive query with no rows
    "WITH RECURSIVE r(n) AS (SELECT i FROM t WHERE i < 0 UNION ALL SELECT n + 1 FROM r WHERE n < 3) \
     SELECT count(*) AS c FROM r",
];

/// One gradient-descent step per distributed query, iterated from the client
/// until the parameters stop moving; returns (w, b, steps).
async fn descend(ctx: &SessionContext) -> Result<(f64, f64, usize)> {
    let (mut w, mut b) = (0.0f64, 0.0f64);
    for step in 1..=500 {
        let out = rows(
            ctx,
            &format!(
                "SELECT w - 0.75 * grad(avg(power(w * x + b - y, 2)), w) AS w, \
                        b - 0.75 * grad(avg(power(w * x + b - y, 2)), b) AS b \
                 FROM t CROSS JOIN (SELECT CAST({w:e} AS DOUBLE) AS w, CAST({b:e} AS DOUBLE) AS b) AS p \
                 GROUP BY w, b"
            ),
        )
        .await?;
        let col = |i: usize| {
            out.column(i)
                .as_any()
                .downcast_ref::<Float64Array>()
                .unwrap()
                .value(0)
        };
        let (nw, nb) = (col(0), col(1));
        let moved = (nw - w).abs().max((nb - b).abs());
        (w, b) = (nw, nb);
        if moved < 1e-10 {
            return Ok((w, b, step));
        }
    }
    Ok((w, b, 500))
}

/// A training loop over the partitioned data, eight steps.
const LOOP: &str = "WITH RECURSIVE fit(step, w) AS ( \
       SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w \
       UNION ALL \
       SELECT step + 1, w - 0.5 * grad(avg(power(w * x - y, 2)), w) \
       FROM fit CROSS JOIN t WHERE step < 8 GROUP BY step, w) \
     SELECT step, w FROM fit ORDER BY step";

/// `LOOP` on `remote` gives `local`'s numbers, and how many partitions the
/// executors of this process served from what they kept.
async fn kept_loop(local: &SessionContext, remote: &SessionContext) -> Result<u64> {
    let expected = rows(local, LOOP).await?;
    let before = kept_stats();
    let got = rows(remote, LOOP).await?;
    assert_same(LOOP, &expected, &got);
    Ok(kept_stats().replays - before.replays)
}

async fn set(ctx: &SessionContext, setting: &str) -> Result<()> {
    ctx.sql(&format!("SET {setting}")).await?.collect().await?;
    Ok(())
}

/// The executors keep a loop's data (the scan of `t`) across its
/// iterations, and only where asked to.
async fn check_kept_loops(local: &SessionContext, remote: &SessionContext) -> Result<()> {
    // at least one partition of the scan replayed in each of the seven
    // iterations after the first
    let replays = kept_loop(local, remote).await?;
    assert!(replays >= 7, "replays: {replays}");
    // off, or no room on the executors (a client's setting reaches the
    // executors' tasks): nothing replayed, the same numbers
    set(remote, "datafusion_grad.cache_loop_invariants = false").await?;
    let replays = kept_loop(local, remote).await?;
    assert_eq!(replays, 0, "cache_loop_invariants = false");
    set(remote, "datafusion_grad.cache_loop_invariants = true").await?;
    set(remote, "datafusion_grad.ballista_kept_bytes = 0").await?;
    let replays = kept_loop(local, remote).await?;
    assert_eq!(replays, 0, "ballista_kept_bytes = 0");
    set(remote, "datafusion_grad.ballista_kept_bytes = 2147483648").await?;
    // a query outside a recursive query keeps nothing
    let before = kept_stats();
    rows(remote, "SELECT sum(x) AS s FROM t").await?;
    rows(remote, "SELECT sum(x) AS s FROM t").await?;
    assert_eq!(kept_stats().replays, before.replays);
    Ok(())
}

/// The gradient of a loss after a training loop over the partitioned data
/// (each step aggregates over `t`) with respect to the initial weights:
/// the backward recursive query of reverse mode.
const META_GRADIENT: &str = "WITH RECURSIVE train(step, w, w0) AS ( \
       SELECT 0, w0 AS w, w0 FROM (SELECT tensor([0.1, -0.2], 2) AS w0) i \
       UNION ALL \
       SELECT step + 1, \
              tensor_sub(w, scale(tensor_avg(grad(power(tanh(dot(w, tensor([x, 1.0], 2))) - y / 5.0, 2), w)), 0.5)), w0 \
       FROM train CROSS JOIN t WHERE step < 4 GROUP BY step, w, w0) \
     SELECT w0, grad(tensor_total(tensor_mul(w, w)), w0) AS g FROM train WHERE step = 4";

/// The derivative of a loss after a training loop over `t` with respect to
/// every row's `y` (relational reverse mode through the loop), summed with
/// the rows' own weights so that one row comes back.
const VALUATION: &str = "WITH RECURSIVE train(step, w) AS ( \
       SELECT 0, CAST(0.0 AS DOUBLE) \
       UNION ALL \
       SELECT step + 1, w - 0.5 * avg(grad(power(w * t.x - t.y, 2), w)) \
       FROM train CROSS JOIN t WHERE step < 3 GROUP BY step, w), \
     loss AS (SELECT power(w - 2.5, 2) AS loss FROM train WHERE step = 3), \
     g AS (SELECT i, grad((SELECT loss FROM loss), t.y) AS g FROM t) \
     SELECT count(*) AS n, sum(g * sin(CAST(i AS DOUBLE))) AS s, max(abs(g)) AS m FROM g";

/// Reverse mode through loops whose steps aggregate over the partitioned
/// data runs its backward query on the cluster too, with the local numbers
/// (and reverse mode gives forward mode's).
async fn check_reverse_through_loops(
    local: &SessionContext,
    remote: &SessionContext,
) -> Result<()> {
    let forward = rows(local, META_GRADIENT).await?;
    for ctx in [local, remote] {
        set(ctx, "datafusion_grad.recursion_mode = 'reverse'").await?;
    }
    let reverse = rows(local, META_GRADIENT).await?;
    let plan = rows(local, &format!("EXPLAIN {META_GRADIENT}")).await?;
    assert!(
        format!("{:?}", plan.column(1)).contains("__dfgrad_back"),
        "not the backward recursive query: {plan:?}"
    );
    let got = rows(remote, META_GRADIENT).await?;
    for ctx in [local, remote] {
        set(ctx, "datafusion_grad.recursion_mode = 'auto'").await?;
    }
    let tensor = |b: &RecordBatch| -> Vec<f64> {
        let list = b.column(1).as_fixed_size_list();
        list.values()
            .as_primitive::<Float64Type>()
            .values()
            .to_vec()
    };
    let close = |a: &[f64], b: &[f64]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-9 * x.abs().max(1.0))
    };
    let (f, r, g) = (tensor(&forward), tensor(&reverse), tensor(&got));
    assert!(f.len() == 2 && f.iter().all(|v| *v != 0.0), "{f:?}");
    assert!(close(&f, &r), "forward {f:?}, reverse {r:?}");
    assert!(close(&r, &g), "local {r:?}, ballista {g:?}");

    let expected = rows(local, VALUATION).await?;
    let got = rows(remote, VALUATION).await?;
    assert_same(VALUATION, &expected, &got);
    let n = expected.column(0).as_primitive::<Int64Type>();
    let m = expected.column(2).as_primitive::<Float64Type>();
    assert_eq!(n.value(0), ROWS * FILES);
    assert!(m.value(0) > 0.0, "every row's derivative is 0");
    Ok(())
}

/// Bounds each distributed query of `ctx` to `seconds`.
async fn set_timeout(ctx: &SessionContext, seconds: u64) -> Result<()> {
    ctx.sql(&format!(
        "SET datafusion_grad.ballista_timeout_seconds = {seconds}"
    ))
    .await?
    .collect()
    .await?;
    Ok(())
}

async fn check_queries(local: &SessionContext, remote: &SessionContext) -> Result<()> {
    for sql in QUERIES {
        let l = rows(local, sql).await?;
        let r = rows(remote, sql).await?;
        assert_same(sql, &l, &r);
    }
    let l = rows(local, RELATIONAL_VALUATION).await?;
    assert_eq!(
        l.column(0).as_primitive::<Int64Type>().value(0),
        ROWS * FILES
    );
    let refused = rows(remote, RELATIONAL_VALUATION)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused
            .contains("[needs_plan_context] on Ballista, relational reverse mode through a loop"),
        "{refused}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standalone_cluster_gives_the_local_numbers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_points(dir.path()).await?;
    let local = datafusion_grad::session_context();
    register(&local, dir.path()).await?;
    let remote = datafusion_grad::ballista::standalone().await?;
    // each task reads its own partition's files (no work stealing, which
    // would let a task read files of partitions run elsewhere)
    assert!(
        !remote
            .state()
            .config()
            .options()
            .execution
            .enable_file_stream_work_stealing
    );
    register(&remote, dir.path()).await?;
    check_queries(&local, &remote).await?;
    check_kept_loops(&local, &remote).await?;
    check_reverse_through_loops(&local, &remote).await?;

    let (lw, lb, ls) = descend(&local).await?;
    let (rw, rb, rs) = descend(&remote).await?;
    assert!(
        (lw - 2.5).abs() < 0.01 && (lb + 0.7).abs() < 0.01,
        "w={lw} b={lb}"
    );
    assert!(
        (lw - rw).abs() < 1e-9 && (lb - rb).abs() < 1e-9,
        "local {lw},{lb} ballista {rw},{rb}"
    );
    assert!(ls.abs_diff(rs) <= 2, "steps: local {ls}, ballista {rs}");

    // the rewrite happened on the client: Ballista's stages compute the
    // derivative `x + x`
    let plan = rows(&remote, "EXPLAIN SELECT grad(x * x, x) FROM t").await?;
    let text = format!("{:?}", plan.column(1));
    assert!(
        text.contains("ShuffleWriterExec") && text.contains("projection=[x@0 + x@0 as grad("),
        "{text}"
    );

    // what cannot be differentiated is refused on the client, typed
    let err = remote
        .sql("SELECT grad(random() * x, x) FROM t")
        .await
        .and_then(|df| df.into_optimized_plan())
        .unwrap_err();
    assert!(err.to_string().contains("non_differentiable"), "{err}");

    // a gradient table's duplicate-rows check fails on the executors too
    let err = rows(
        &remote,
        "WITH p(k, w) AS (VALUES (0, 0.5), (0, 1.5)), \
              s AS (SELECT sum(p.w * t.x) AS loss FROM t JOIN p ON p.k = t.i % 2) \
         SELECT k, grad((SELECT loss FROM s), p.w) AS g FROM p",
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("several rows with the same other columns"),
        "{err}"
    );
    Ok(())
}

/// Child processes killed when dropped.
struct Cluster {
    children: Vec<Child>,
    url: String,
    _work: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The number of executors the scheduler on `port` knows (its REST API).
fn executors(port: u16) -> usize {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let request = "GET /api/executors HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if s.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.matches("\"last_seen\"").count()
}

/// A scheduler and two executors, as processes on loopback; executors
/// heartbeat every second and are lost after 10 s without one (a margin for
/// a loaded machine, where a live executor's heartbeat can be late).
fn start_cluster() -> Cluster {
    let work = tempfile::tempdir().expect("work dir");
    let port = free_port();
    let log = |name: &str| {
        std::fs::File::create(work.path().join(name))
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null())
    };
    let scheduler = Command::new(env!("CARGO_BIN_EXE_dfgrad-scheduler"))
        .args(["--bind-port", &port.to_string()])
        .args(["--executor-timeout-seconds", "10"])
        .args(["--expire-dead-executor-interval-seconds", "1"])
        .stdout(log("scheduler.log"))
        .stderr(log("scheduler.err"))
        .spawn()
        .expect("dfgrad-scheduler starts");
    let mut children = vec![scheduler];
    for e in 0..2 {
        let dir = work.path().join(format!("executor-{e}"));
        std::fs::create_dir_all(&dir).expect("executor dir");
        let executor = Command::new(env!("CARGO_BIN_EXE_dfgrad-executor"))
            .args(["--scheduler-port", &port.to_string()])
            .args(["--bind-port", &free_port().to_string()])
            .args(["--bind-grpc-port", &free_port().to_string()])
            .args(["--concurrent-tasks", "2"])
            .args(["--heartbeat-interval-seconds", "1"])
            .args(["--work-dir", dir.to_str().expect("utf-8 path")])
            .stdout(log(&format!("executor-{e}.log")))
            .stderr(log(&format!("executor-{e}.err")))
            .spawn()
            .expect("dfgrad-executor starts");
        children.push(executor);
    }
    let cluster = Cluster {
        children,
        url: format!("df://127.0.0.1:{port}"),
        _work: work,
    };
    let start = Instant::now();
    while executors(port) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the executors did not register within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scheduler_and_two_executor_processes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_points(dir.path()).await?;
    let local = datafusion_grad::session_context();
    register(&local, dir.path()).await?;
    let mut cluster = start_cluster();
    let remote = datafusion_grad::ballista::remote(&cluster.url).await?;
    register(&remote, dir.path()).await?;
    check_queries(&local, &remote).await?;

    let (lw, lb, _) = descend(&local).await?;
    let (rw, rb, _) = descend(&remote).await?;
    assert!(
        (lw - rw).abs() < 1e-9 && (lb - rb).abs() < 1e-9,
        "local {lw},{lb} ballista {rw},{rb}"
    );

    // dfgrad --ballista: the same training loop from the command line
    let out = Command::new(env!("CARGO_BIN_EXE_dfgrad"))
        .args(["--ballista", &cluster.url, "--format", "csv", "-q"])
        .args([
            "--table",
            &format!("t={}/part-0.parquet", dir.path().display()),
        ])
        .args(["-c", QUERIES[4]])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = String::from_utf8_lossy(&out.stdout);
    assert_eq!(csv.lines().count(), 12, "{csv}");

    // one executor killed mid-query: the query completes on the other one
    // with the local numbers, or fails with an error, within the client's
    // bound (datafusion_grad.ballista_timeout_seconds): never a wrong
    // result, never an endless wait
    set_timeout(&remote, 90).await?;
    let sql = "SELECT w, grad(avg((w * x - y) * (w * x - y)), w) AS g, count(*) AS n \
               FROM t CROSS JOIN (SELECT CAST(value AS DOUBLE) / 10.0 AS w FROM (VALUES (1), (2), (3), (4), (5), (6), (7), (8)) AS v(value)) AS p \
               GROUP BY w ORDER BY w";
    let expected = rows(&local, sql).await?;
    let query = {
        let remote = remote.clone();
        tokio::spawn(async move { rows(&remote, sql).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.children[2].kill()?;
    cluster.children[2].wait()?;
    match tokio::time::timeout(Duration::from_secs(150), query).await {
        Ok(Ok(Ok(got))) => {
            assert_same(sql, &expected, &got);
            let n = got.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
            assert!(
                n.iter().all(|c| c == Some(ROWS * FILES)),
                "every row counted once"
            );
        }
        Ok(Ok(Err(e))) => eprintln!("the query failed after the executor was killed: {e}"),
        Ok(Err(join)) => panic!("query task: {join}"),
        Err(_) => panic!("the 90 s bound did not hold: nothing 150 s after an executor was killed"),
    }
    // and the cluster still answers with one executor
    let again = rows(&remote, sql).await?;
    assert_same(sql, &expected, &again);

    // no executor left: a typed cluster_timeout error once the bound passes
    set_timeout(&remote, 3).await?;
    cluster.children[1].kill()?;
    cluster.children[1].wait()?;
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(60), rows(&remote, sql))
        .await
        .expect("the 3 s bound holds")
        .expect_err("no executor is left to answer");
    let kind = GradError::find(&err).map(GradError::kind);
    assert_eq!(kind, Some(ErrorKind::ClusterTimeout), "{err}");
    assert!(
        err.to_string()
            .contains("SET datafusion_grad.ballista_timeout_seconds"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

/// The scheduler's rule keeps, in a query of one iteration (the loop run
/// named), the largest parts that read the data files only: not the work
/// table's rows (`VALUES`), not what a volatile function reads; and nothing
/// in a query outside a loop.
#[tokio::test]
async fn the_scheduler_keeps_only_the_loop_invariant_file_scans() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_points(dir.path()).await?;
    let ctx = datafusion_grad::session_context_with_config(datafusion_grad::ballista::config());
    register(&ctx, dir.path()).await?;
    // what the rule makes of a step's plan, with the loop run `run` named
    let keep = |sql: &'static str, run: &'static str| {
        let ctx = ctx.clone();
        async move {
            let plan = ctx.sql(sql).await?.create_physical_plan().await?;
            let mut options = ctx.state().config().options().as_ref().clone();
            options
                .extensions
                .get_mut::<GradOptions>()
                .expect("our settings")
                .ballista_loop_run = run.to_string();
            let plan = KeepOnExecutors.optimize(plan, &options)?;
            let text = displayable(plan.as_ref()).indent(true).to_string();
            Ok::<_, datafusion::error::DataFusionError>(text)
        }
    };
    // the lines under each kept node
    let kept_parts = |text: &str| -> Vec<String> {
        let lines: Vec<&str> = text.lines().collect();
        let depth = |l: &str| l.len() - l.trim_start().len();
        lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.contains("KeptOnExecutorsExec"))
            .map(|(i, l)| {
                lines[i + 1..]
                    .iter()
                    .take_while(|m| depth(m) > depth(l))
                    .copied()
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect()
    };
    let step = "SELECT w - 0.5 * grad(avg(power(w * x - y, 2)), w) AS w \
                FROM (VALUES (CAST(0.5 AS DOUBLE))) AS fit(w) CROSS JOIN t \
                WHERE x > -2 GROUP BY w";
    let text = keep(step, "run-1").await?;
    let parts = kept_parts(&text);
    assert_eq!(parts.len(), 1, "{text}");
    assert!(
        parts[0].contains("file_type=parquet") && !parts[0].contains("partition_sizes"),
        "{text}"
    );
    assert!(text.contains("KeptOnExecutorsExec: run=run-1"), "{text}");
    // not in a query outside a loop
    assert!(!keep(step, "").await?.contains("KeptOnExecutorsExec"));
    // a volatile filter is computed every step, over the kept scan
    let text = keep(
        "SELECT w - 0.5 * grad(avg(power(w * x - y, 2)), w) AS w \
         FROM (VALUES (CAST(0.5 AS DOUBLE))) AS fit(w) CROSS JOIN t \
         WHERE x > random() - 3 GROUP BY w",
        "run-1",
    )
    .await?;
    let parts = kept_parts(&text);
    assert_eq!(parts.len(), 1, "{text}");
    assert!(!parts[0].contains("random"), "{text}");
    Ok(())
}

/// `query`, planned by a scheduler (after `settings`), holds `operator`,
/// which travels through the codec as the plan it replaces and is rebuilt
/// on arrival; the rows are the local ones without it (`off`, a setting).
/// The plan as planned, for more checks.
async fn travels(query: &str, settings: &[&str], operator: &str, off: &str) -> Result<String> {
    let dir = tempfile::tempdir()?;
    write_points(dir.path()).await?;
    let scheduler = SessionContext::new_with_state(datafusion_grad::ballista::session_state(
        datafusion_grad::ballista::config(),
    )?);
    register(&scheduler, dir.path()).await?;
    for setting in settings {
        set(&scheduler, setting).await?;
    }
    let plan = scheduler.sql(query).await?.create_physical_plan().await?;
    let text = displayable(plan.as_ref()).indent(true).to_string();
    assert!(text.contains(operator), "{text}");
    let codec = GradPhysicalCodec::default();
    let travelled = PhysicalPlanNode::try_from_physical_plan(plan, &codec)?
        .try_into_physical_plan(&scheduler.task_ctx(), &codec)?;
    let after = displayable(travelled.as_ref()).indent(true).to_string();
    assert!(after.contains(operator), "{after}");
    let batches = collect(travelled, scheduler.task_ctx()).await?;
    let got = concat_batches(&batches[0].schema(), &batches)?;
    let local = datafusion_grad::session_context();
    register(&local, dir.path()).await?;
    set(&local, off).await?;
    let expected = rows(&local, query).await?;
    assert_same(query, &expected, &got);
    Ok(text)
}

/// The scheduler plans broadcast aggregations of a step's own partitions:
/// the final aggregate stays, after an exchange; the operator travels.
#[tokio::test]
async fn the_scheduler_plans_broadcast_aggregations_that_travel() -> Result<()> {
    let step = "SELECT w, b, w - 0.5 * grad(avg(power(w * x + b - y, 2)), w) AS w1, \
                b - 0.5 * grad(avg(power(w * x + b - y, 2)), b) AS b1, count(*) AS n \
                FROM (VALUES (CAST(0.5 AS DOUBLE), CAST(0.1 AS DOUBLE)), \
                             (CAST(-0.5 AS DOUBLE), CAST(0.1 AS DOUBLE))) AS fit(w, b) \
                CROSS JOIN t WHERE x > -0.5 GROUP BY w, b ORDER BY w";
    let text = travels(
        step,
        &[],
        "BroadcastAggregateExec",
        "datafusion_grad.broadcast_aggregate = false",
    )
    .await?;
    // each partition's own: the final aggregate stays, after an exchange
    assert!(text.contains("AggregateExec: mode=Final"), "{text}");
    assert!(
        text.contains("RepartitionExec") || text.contains("CoalescePartitionsExec"),
        "{text}"
    );
    Ok(())
}

/// A contraction (a partial aggregate of sums of products and its join,
/// `ContractionExec`) is planned by the scheduler and travels. Ballista
/// plans sort-merge joins by default; contractions replace hash joins.
#[tokio::test]
async fn the_scheduler_plans_contractions_that_travel() -> Result<()> {
    let query = "SELECT d.g, p.h, sum(d.x * p.w) AS s, sum(p.w) AS n \
                 FROM (SELECT i % 3 AS k, i % 5 AS g, x FROM t) AS d \
                 JOIN (VALUES (0, 0, 0.5), (1, 0, 1.5), (2, 1, 2.5), (2, 2, -1.0)) AS p(k, h, w) \
                 ON p.k = d.k GROUP BY d.g, p.h ORDER BY d.g, p.h";
    travels(
        query,
        &["datafusion.optimizer.prefer_hash_join = true"],
        "ContractionExec",
        "datafusion_grad.contraction = false",
    )
    .await?;
    // a chain (three inputs: the rows streamed, both factors listed)
    let query = "SELECT d.g, sum(d.x * a.w * b.w) AS s \
                 FROM (SELECT i % 3 AS k, i % 5 AS g, i % 2 AS m, x FROM t) AS d \
                 JOIN (VALUES (0, 0, 0.5), (1, 1, 1.5), (2, 0, 2.5), (2, 1, -1.0)) AS a(k, c, w) \
                 ON a.k = d.k \
                 JOIN (VALUES (0, 0, 1.0), (1, 0, 2.0), (0, 1, 3.0), (1, 1, -2.0)) AS b(m, c, w) \
                 ON b.m = d.m AND b.c = a.c GROUP BY d.g ORDER BY d.g";
    travels(
        query,
        &["datafusion.optimizer.prefer_hash_join = true"],
        "links=",
        "datafusion_grad.contraction = false",
    )
    .await?;
    Ok(())
}
