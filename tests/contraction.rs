//! The contraction operator (`datafusion_grad::exec::contraction`) against
//! DataFusion's own join + aggregate on random relations: the same groups
//! and the same sums (to rounding), whatever the keys' types and ranges,
//! the duplicates, the NULL keys and values, the partitions, and which side
//! the group columns come from.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{collect, displayable};
use datafusion::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// How a random relation's keys are drawn.
#[derive(Clone, Copy, Debug)]
enum Keys {
    /// `0..count` as `Int64`.
    Dense(i64),
    /// `count` values spread over a wide range, as `Int32`.
    Sparse(i64),
    /// `count` strings.
    Strings(i64),
}

impl Keys {
    fn data_type(self) -> DataType {
        match self {
            Keys::Dense(_) => DataType::Int64,
            Keys::Sparse(_) => DataType::Int32,
            Keys::Strings(_) => DataType::Utf8,
        }
    }

    fn column(self, values: Vec<Option<i64>>) -> ArrayRef {
        match self {
            Keys::Dense(_) => Arc::new(Int64Array::from(values)),
            Keys::Sparse(_) => Arc::new(Int32Array::from(
                values
                    .into_iter()
                    .map(|v| v.map(|v| (v * 7919 - 40_000) as i32))
                    .collect::<Vec<_>>(),
            )),
            Keys::Strings(_) => Arc::new(StringArray::from(
                values
                    .into_iter()
                    .map(|v| v.map(|v| format!("k{v}")))
                    .collect::<Vec<_>>(),
            )),
        }
    }

    fn draw(self, rng: &mut StdRng, nulls: f64) -> Option<i64> {
        let count = match self {
            Keys::Dense(c) | Keys::Sparse(c) | Keys::Strings(c) => c,
        };
        (!rng.random_bool(nulls)).then(|| rng.random_range(0..count))
    }
}

/// A relation `(a, b, v)` of `rows` random rows: keys `a` and `b` drawn as
/// `ka` and `kb` (NULL with probability `nulls`), `v` a double (NULL as
/// often); rows repeat where the draws do.
fn relation(rng: &mut StdRng, rows: usize, ka: Keys, kb: Keys, nulls: f64) -> RecordBatch {
    let a: Vec<_> = (0..rows).map(|_| ka.draw(rng, nulls)).collect();
    let b: Vec<_> = (0..rows).map(|_| kb.draw(rng, nulls)).collect();
    let v: Vec<_> = (0..rows)
        .map(|_| (!rng.random_bool(nulls)).then(|| rng.random_range(-2.0..2.0)))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", ka.data_type(), true),
        Field::new("b", kb.data_type(), true),
        Field::new("v", DataType::Float64, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![ka.column(a), kb.column(b), Arc::new(Float64Array::from(v))],
    )
    .unwrap()
}

/// Every pair of `ka`'s and `kb`'s values once, in a random order, with
/// random values (none NULL); then `repeats` of those rows again: a
/// dense relation (the repeated keys' lists are not dense).
fn full(rng: &mut StdRng, ka: Keys, kb: Keys, repeats: usize) -> RecordBatch {
    let count = |k: Keys| match k {
        Keys::Dense(c) | Keys::Sparse(c) | Keys::Strings(c) => c,
    };
    let mut pairs: Vec<(i64, i64)> = (0..count(ka))
        .flat_map(|a| (0..count(kb)).map(move |b| (a, b)))
        .collect();
    pairs.shuffle(rng);
    for _ in 0..repeats {
        let again = pairs[rng.random_range(0..pairs.len())];
        pairs.push(again);
    }
    let v: Vec<_> = (0..pairs.len())
        .map(|_| Some(rng.random_range(-2.0..2.0)))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", ka.data_type(), true),
        Field::new("b", kb.data_type(), true),
        Field::new("v", DataType::Float64, true),
    ]));
    let (a, b): (Vec<_>, Vec<_>) = pairs.iter().map(|&(a, b)| (Some(a), Some(b))).unzip();
    RecordBatch::try_new(
        schema,
        vec![ka.column(a), kb.column(b), Arc::new(Float64Array::from(v))],
    )
    .unwrap()
}

/// The rows of `sql` by their group columns (the first `groups`), each
/// with its sums; and its plan.
async fn answer(
    ctx: &SessionContext,
    sql: &str,
    groups: usize,
) -> Result<(BTreeMap<Vec<String>, Vec<Option<f64>>>, String)> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    // The plan with the metrics of the run (`gemm_rows=`).
    let text = DisplayableExecutionPlan::with_metrics(plan.as_ref())
        .indent(false)
        .to_string();
    let mut rows = BTreeMap::new();
    for batch in &batches {
        for row in 0..batch.num_rows() {
            let key = (0..groups)
                .map(|c| array_value_to_string(batch.column(c), row).unwrap())
                .collect::<Vec<_>>();
            let sums = (groups..batch.num_columns())
                .map(|c| {
                    let c = batch
                        .column(c)
                        .as_any()
                        .downcast_ref::<Float64Array>()
                        .unwrap();
                    c.is_valid(row).then(|| c.value(row))
                })
                .collect();
            assert!(rows.insert(key, sums).is_none(), "a group twice: {sql}");
        }
    }
    Ok((rows, text))
}

/// `sql`'s answer with the operator (and its plan) and without it: the
/// same groups, the same sums to 1e-12.
async fn same_answers(
    ctx: &SessionContext,
    sql: &str,
    groups: usize,
    what: &str,
) -> Result<String> {
    let (on, plan) = answer(ctx, sql, groups).await?;
    ctx.sql("SET datafusion_grad.contraction = false")
        .await?
        .collect()
        .await?;
    let (off, plan_off) = answer(ctx, sql, groups).await?;
    ctx.sql("SET datafusion_grad.contraction = true")
        .await?
        .collect()
        .await?;
    assert!(!plan_off.contains("ContractionExec"));
    assert_same(&on, &off, &format!("{what}: {sql}"));
    Ok(plan)
}

/// Asserts that `got` has `expected`'s groups and sums (to 1e-12).
fn assert_same(
    got: &BTreeMap<Vec<String>, Vec<Option<f64>>>,
    expected: &BTreeMap<Vec<String>, Vec<Option<f64>>>,
    what: &str,
) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "{what}"
    );
    for (key, sums) in got {
        for (a, b) in sums.iter().zip(&expected[key]) {
            let same = match (a, b) {
                (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                (None, None) => true,
                _ => false,
            };
            assert!(same, "{what}, {key:?}: {a:?} vs {b:?}");
        }
    }
}

/// Whether a plan run with its metrics shown added rows by the GEMM.
fn ran_as_gemm(plan: &str) -> bool {
    plan.split("gemm_rows=")
        .skip(1)
        .any(|rest| !rest.starts_with('0'))
}

/// Partial aggregates (and contractions whose groups are the probe rows')
/// give each row as its own group after 10 rows.
async fn skip_aggregating(ctx: &SessionContext) -> Result<()> {
    for setting in [
        "SET datafusion.execution.skip_partial_aggregation_probe_rows_threshold = 10",
        "SET datafusion.execution.skip_partial_aggregation_probe_ratio_threshold = 0.0",
    ] {
        ctx.sql(setting).await?.collect().await?;
    }
    Ok(())
}

/// Registers `batch` as table `name` in `parts` partitions (1 or 2).
fn register_parts(
    ctx: &SessionContext,
    name: &str,
    batch: &RecordBatch,
    parts: usize,
) -> Result<()> {
    let half = batch.num_rows() / 2;
    let partitions = match parts {
        1 => vec![vec![batch.clone()]],
        _ => vec![
            vec![batch.slice(0, half)],
            vec![batch.slice(half, batch.num_rows() - half)],
        ],
    };
    ctx.register_table(
        name,
        Arc::new(MemTable::try_new(batch.schema(), partitions)?),
    )?;
    Ok(())
}

/// A session of `partitions` target partitions with `tables` registered,
/// each in `parts` partitions (a table of one partition in a session of
/// one: DataFusion's aggregate in one step, `mode=Single`); at 3
/// partitions, every row its own group after the first few (as the
/// partial aggregates do where groups are nearly rows).
async fn random_context(
    partitions: usize,
    parts: usize,
    tables: &[(&str, &RecordBatch)],
) -> Result<SessionContext> {
    let ctx = datafusion_grad::session_context_with_config(
        SessionConfig::new().with_target_partitions(partitions),
    );
    for (name, batch) in tables {
        register_parts(&ctx, name, batch, parts)?;
    }
    if partitions == 3 {
        skip_aggregating(&ctx).await?;
    }
    Ok(ctx)
}

/// Random relations x(n, d, v) and w(d, h, v), and queries of every shape
/// the operator takes: the same answer with it as without it.
#[tokio::test]
async fn contractions_answer_as_the_join_and_aggregate_do() -> Result<()> {
    let queries: &[(&str, usize)] = &[
        (
            "SELECT x.a, w.b, sum(x.v * w.v) FROM x JOIN w ON x.b = w.a GROUP BY x.a, w.b",
            2,
        ),
        (
            "SELECT w.b, sum(x.v * w.v), sum(w.v) FROM x JOIN w ON x.b = w.a GROUP BY w.b",
            1,
        ),
        (
            "SELECT x.a, sum(x.v * w.v * x.v) FROM x JOIN w ON x.b = w.a GROUP BY x.a",
            1,
        ),
        (
            "SELECT w.b, x.a, x.b, sum(3.0 * x.v * w.v) FROM x JOIN w ON x.b = w.a \
             GROUP BY w.b, x.a, x.b",
            3,
        ),
        // groups that are expressions of one side's columns
        (
            "SELECT x.a + 1, w.b * 2 - 1, sum(x.v * w.v) FROM x JOIN w ON x.b = w.a \
             GROUP BY x.a + 1, w.b * 2 - 1",
            2,
        ),
        // a group reading both sides: the join + aggregate
        (
            "SELECT x.a + w.b, sum(x.v * w.v) FROM x JOIN w ON x.b = w.a GROUP BY x.a + w.b",
            1,
        ),
    ];
    let mut rng = StdRng::seed_from_u64(47);
    let (mut contracted, mut by_gemm, mut finals, mut single) = (0, 0, 0, 0);
    let mut per_query = vec![0; queries.len()];
    for case in 0..30 {
        let (n, d, h) = (
            rng.random_range(1..40),
            rng.random_range(1..12),
            rng.random_range(1..300),
        );
        let kinds = [Keys::Dense(d), Keys::Sparse(d), Keys::Strings(d)];
        let kd = kinds[case % 3];
        // the last cases: w every (d, h) once (a dense matrix; in odd
        // cases a few rows repeated), nothing NULL: rows of sums side by side
        let dense = case >= 24;
        let nulls = match dense {
            true => 0.0,
            false => [0.0, 0.05, 0.3][case / 3 % 3],
        };
        let (x_rows, w_rows) = (rng.random_range(0..400), rng.random_range(0..200));
        let x = relation(&mut rng, x_rows, Keys::Dense(n), kd, nulls);
        let w = match dense {
            false => relation(&mut rng, w_rows, kd, Keys::Sparse(h), nulls),
            true => full(&mut rng, kd, Keys::Sparse(h % 12 + 1), case % 2 * 3),
        };
        for (partitions, parts) in [(1, 1), (1, 2), (3, 2)] {
            let ctx = random_context(partitions, parts, &[("x", &x), ("w", &w)]).await?;
            for (q, &(sql, groups)) in queries.iter().enumerate() {
                let what = format!("case {case}, {partitions} partitions, tables in {parts}");
                let plan = same_answers(&ctx, sql, groups, &what).await?;
                contracted += plan.contains("ContractionExec") as usize;
                per_query[q] += plan.contains("ContractionExec") as usize;
                by_gemm += ran_as_gemm(&plan) as usize;
                finals += plan.contains("ContractionExec: mode=Final") as usize;
                single += (parts == 1 && plan.contains("ContractionExec: mode=Final")) as usize;
            }
        }
    }
    // The operator ran (more than half of the cases plan a partial
    // aggregate over a hash join), in some of the dense cases as a GEMM,
    // and in final mode where the probe side gives group columns (the
    // first, third and fourth queries, where DataFusion plans a final
    // aggregate).
    assert!(contracted > 24 * (queries.len() - 1) / 2, "{contracted}");
    // Groups that are expressions of one side are taken as the columns
    // are; a group reading both sides never is.
    assert_eq!(per_query[4], per_query[0], "{per_query:?}");
    assert_eq!(per_query[5], 0, "{per_query:?}");
    assert!(by_gemm >= 4, "{by_gemm}");
    assert!(finals > 24, "{finals}");
    // In one partition, DataFusion's single aggregate is replaced whole:
    // in final mode, whichever side gives the groups.
    assert!(single > 24 * (queries.len() - 1) / 2, "{single}");
    Ok(())
}

/// Random ratings r(a, b, v) and factors u(a, k, v), f(b, k, v) (columns
/// a, b, v; keys of every kind, NULL keys and values, repeated rows),
/// queries of the factorization's shape `r JOIN u ON … JOIN f ON … AND
/// f.k = u.k`: the same answer as the joins and aggregate, each planned as
/// a chain (`links=` in the plan: the ratings streamed, the factors
/// listed; DataFusion collects `r ⋈ u` for these small tables, the chain
/// swaps the join's inputs).
#[tokio::test]
async fn chains_answer_as_the_joins_and_aggregate_do() -> Result<()> {
    let queries: &[(&str, usize)] = &[
        (
            "SELECT r.a, r.b, sum(u.v * f.v) FROM r JOIN u ON u.a = r.a \
             JOIN f ON f.a = r.b AND f.b = u.b GROUP BY r.a, r.b",
            2,
        ),
        (
            "SELECT r.a, sum(r.v * u.v * f.v), sum(f.v) FROM r JOIN u ON u.a = r.a \
             JOIN f ON (f.a IS NOT DISTINCT FROM r.b) AND (f.b IS NOT DISTINCT FROM u.b) \
             GROUP BY r.a",
            1,
        ),
        (
            "SELECT r.b, f.b, sum(2.0 * u.v * f.v) FROM r \
             JOIN u ON r.a IS NOT DISTINCT FROM u.a \
             JOIN f ON f.a = r.b AND f.b = u.b GROUP BY r.b, f.b",
            2,
        ),
        (
            "SELECT r.a, r.b, sum(u.v * f.v * r.v) FROM r JOIN u ON u.a = r.a \
             JOIN f ON f.a = r.b AND f.b = u.b AND f.b = r.a GROUP BY r.a, r.b",
            2,
        ),
    ];
    let mut rng = StdRng::seed_from_u64(4700);
    let (mut chained, mut cases, mut finals) = (0, 0, 0);
    for case in 0..24 {
        let (users, items, k) = (
            rng.random_range(1..30),
            rng.random_range(1..30),
            rng.random_range(1..20),
        );
        let kinds = [Keys::Dense(k), Keys::Sparse(k), Keys::Strings(k)];
        let kk = kinds[case % 3];
        // the last cases: u and f every (key, k) once (dense; in odd cases
        // a few rows repeated), nothing NULL: a dot product per rating
        let dense = case >= 18;
        let nulls = match dense {
            true => 0.0,
            false => [0.0, 0.05, 0.3][case / 3 % 3],
        };
        let rows = rng.random_range(0..600);
        let r = relation(
            &mut rng,
            rows,
            Keys::Dense(users),
            Keys::Dense(items),
            nulls,
        );
        let (u, f) = match dense {
            false => (
                relation(&mut rng, rows / 8, Keys::Dense(users), kk, nulls),
                relation(&mut rng, rows / 8, Keys::Dense(items), kk, nulls),
            ),
            true => (
                full(&mut rng, Keys::Dense(users), kk, case % 2 * 3),
                full(&mut rng, Keys::Dense(items), kk, case % 2 * 3),
            ),
        };
        for partitions in [2, 3] {
            let ctx = random_context(partitions, 2, &[("r", &r), ("u", &u), ("f", &f)]).await?;
            for (q, &(sql, groups)) in queries.iter().enumerate() {
                // the fourth query's link f.b = r.a compares a string with
                // an integer where the factor keys are strings
                if q == 3 && matches!(kk, Keys::Strings(_)) {
                    continue;
                }
                let what = format!("case {case}, {partitions} partitions");
                let plan = same_answers(&ctx, sql, groups, &what).await?;
                chained += plan.contains("links=") as usize;
                finals += plan.contains("ContractionExec: mode=Final") as usize;
                cases += 1;
            }
        }
    }
    assert_eq!(chained, cases);
    // chains in final mode too (the ratings hashed by their group columns)
    assert!(finals > cases / 2, "{finals} of {cases}");
    Ok(())
}

/// Random ratings r(a, b, v), adjoint-like rows e(a, b, v) of the same
/// keys and factors f(a, b, v), queries of a factorization's ∂/∂u shape
/// `(r JOIN e) JOIN f ON f.a = r.b`: DataFusion collects the join `r ⋈ e`
/// (it has no estimate of its rows) and probes it with `f`; no chain forms
/// (the build side's key reads `r` alone), so the operator swaps the two
/// inputs, lists `f` and streams `r ⋈ e`. The same answer as the joins and
/// aggregate, whatever the keys, the NULLs, the repeated rows and the
/// partitions.
#[tokio::test]
async fn swapped_pairs_answer_as_the_joins_and_aggregate_do() -> Result<()> {
    let queries: &[(&str, usize)] = &[
        (
            "SELECT r.a, f.b, sum(e.v * f.v) FROM r JOIN e ON e.a = r.a AND e.b = r.b \
             JOIN f ON f.a = r.b GROUP BY r.a, f.b",
            2,
        ),
        (
            "SELECT f.b, sum(r.v * e.v * f.v), sum(f.v) FROM r \
             JOIN e ON e.a = r.a AND e.b = r.b \
             JOIN f ON f.a IS NOT DISTINCT FROM r.b GROUP BY f.b",
            1,
        ),
        (
            "SELECT r.a, r.b, f.b, sum(3.0 * e.v * f.v) FROM r \
             JOIN e ON (e.a IS NOT DISTINCT FROM r.a) AND e.b = r.b \
             JOIN f ON f.a = r.b GROUP BY r.a, r.b, f.b",
            3,
        ),
    ];
    let mut rng = StdRng::seed_from_u64(4701);
    let (mut swapped, mut cases) = (0, 0);
    for case in 0..18 {
        let (users, items, k) = (
            rng.random_range(1..30),
            rng.random_range(1..30),
            rng.random_range(1..20),
        );
        let kinds = [Keys::Dense(k), Keys::Sparse(k), Keys::Strings(k)];
        let nulls = [0.0, 0.05, 0.3][case / 3 % 3];
        let rows = rng.random_range(0..600);
        let r = relation(
            &mut rng,
            rows,
            Keys::Dense(users),
            Keys::Dense(items),
            nulls,
        );
        let e = relation(
            &mut rng,
            rows,
            Keys::Dense(users),
            Keys::Dense(items),
            nulls,
        );
        let f = match case % 4 == 3 {
            // every (item, k) once: dense lists
            true => full(&mut rng, Keys::Dense(items), kinds[case % 3], 0),
            false => relation(
                &mut rng,
                rows / 4,
                Keys::Dense(items),
                kinds[case % 3],
                nulls,
            ),
        };
        for partitions in [1, 2, 3] {
            let ctx = random_context(partitions, 2, &[("r", &r), ("e", &e), ("f", &f)]).await?;
            for &(sql, groups) in queries {
                let what = format!("case {case}, {partitions} partitions");
                let plan = same_answers(&ctx, sql, groups, &what).await?;
                swapped += lists_a_table(&plan) as usize;
                cases += 1;
            }
        }
    }
    assert!(swapped > cases / 2, "{swapped} of {cases}");
    Ok(())
}

/// Whether the first `ContractionExec` of a plan lists rows that are no
/// join (its first input has no `HashJoinExec` below it) and streams a
/// join's rows (its second input has one).
fn lists_a_table(plan: &str) -> bool {
    let lines: Vec<&str> = plan.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let Some(at) = lines.iter().position(|l| l.contains("ContractionExec")) else {
        return false;
    };
    let child = indent(lines[at]) + 2;
    // the inputs' subtrees, by the lines at the children's indentation
    let starts: Vec<usize> = (at + 1..lines.len())
        .take_while(|&i| indent(lines[i]) >= child)
        .filter(|&i| indent(lines[i]) == child)
        .collect();
    let subtree = |n: usize| {
        let end = starts.get(n + 1).copied().unwrap_or_else(|| {
            (starts[n] + 1..lines.len())
                .find(|&i| indent(lines[i]) < child)
                .unwrap_or(lines.len())
        });
        lines[starts[n]..end].join("\n")
    };
    starts.len() == 2 && !subtree(0).contains("HashJoinExec") && subtree(1).contains("HashJoinExec")
}

/// The gradient of `Σ y²`, `y = Σ x.v·w.v` over `x JOIN w GROUP BY x.a,
/// w.b`, with respect to every row of `w` (`2·Xᵀ·Y` where nothing is NULL)
/// and of `x` (`2·Y·Wᵀ`), against the sums written out here with SQL's
/// rules: NULL keys match nothing, NULL group keys are one group, a NULL
/// product is not added, a group of NULL products is NULL and sends
/// nothing, duplicate rows count twice, a NULL value has a NULL gradient.
/// Both backward passes run as contractions (`ContractionExec` in the
/// plan; the forward aggregate is shared, out of sight).
#[tokio::test]
async fn gradients_of_a_product_are_its_sums() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(4747);
    for case in 0..12 {
        let (n, d, h) = (
            rng.random_range(1..30),
            rng.random_range(1..10),
            rng.random_range(1..8),
        );
        let nulls = [0.0, 0.1, 0.3][case % 3];
        let maybe = |rng: &mut StdRng, v: i64| (!rng.random_bool(nulls)).then_some(v);
        let x: Vec<(Option<i64>, Option<i64>, Option<f64>)> = (0..rng.random_range(0..300))
            .map(|_| {
                let a = rng.random_range(0..n);
                let b = rng.random_range(0..d + 2);
                let v = rng.random_range(-2.0..2.0);
                (
                    maybe(&mut rng, a),
                    maybe(&mut rng, b),
                    maybe(&mut rng, 0).map(|_| v),
                )
            })
            .collect();
        let mut w: Vec<(Option<i64>, i64, Option<f64>)> = Vec::new();
        for k in 0..d {
            for j in 0..h {
                if rng.random_bool(0.7) {
                    let v = rng.random_range(-2.0..2.0);
                    w.push((Some(k), j, maybe(&mut rng, 0).map(|_| v)));
                }
            }
        }
        w.push((None, 0, Some(1.5)));
        // y per group, as the forward query computes it
        let mut y: BTreeMap<(Option<i64>, i64), Option<f64>> = BTreeMap::new();
        for &(a, b, xv) in &x {
            for &(k, j, wv) in &w {
                if b.is_none() || b != k {
                    continue;
                }
                let sum = y.entry((a, j)).or_insert(None);
                if let (Some(xv), Some(wv)) = (xv, wv) {
                    *sum = Some(sum.unwrap_or(0.0) + xv * wv);
                }
            }
        }
        let expected: Vec<Option<f64>> = (w.iter())
            .map(|&(k, j, wv)| {
                wv?;
                let mut g = 0.0;
                for &(a, b, xv) in &x {
                    if let (Some(b), Some(k), Some(xv)) = (b, k, xv) {
                        if b == k {
                            if let Some(Some(y)) = y.get(&(a, j)) {
                                g += 2.0 * y * xv;
                            }
                        }
                    }
                }
                Some(g)
            })
            .collect();
        let expected_x: Vec<Option<f64>> = (x.iter())
            .map(|&(a, b, xv)| {
                xv?;
                let mut g = 0.0;
                for &(k, j, wv) in &w {
                    if let (Some(b), Some(k), Some(wv)) = (b, k, wv) {
                        if b == k {
                            if let Some(Some(y)) = y.get(&(a, j)) {
                                g += 2.0 * y * wv;
                            }
                        }
                    }
                }
                Some(g)
            })
            .collect();

        let int = |values: Vec<Option<i64>>| Arc::new(Int64Array::from(values)) as ArrayRef;
        let float = |values: Vec<Option<f64>>| Arc::new(Float64Array::from(values)) as ArrayRef;
        let schema = |a: bool| {
            Arc::new(Schema::new(vec![
                Field::new("a", DataType::Int64, true),
                Field::new("b", DataType::Int64, a),
                Field::new("v", DataType::Float64, true),
            ]))
        };
        // x's rows told apart by `i`
        let mut x_fields = schema(true).fields().to_vec();
        x_fields.push(Arc::new(Field::new("i", DataType::Int64, false)));
        let xs = RecordBatch::try_new(
            Arc::new(Schema::new(x_fields)),
            vec![
                int(x.iter().map(|r| r.0).collect()),
                int(x.iter().map(|r| r.1).collect()),
                float(x.iter().map(|r| r.2).collect()),
                int((0..x.len() as i64).map(Some).collect()),
            ],
        )?;
        let ws = RecordBatch::try_new(
            schema(false),
            vec![
                int(w.iter().map(|r| r.0).collect()),
                int(w.iter().map(|r| Some(r.1)).collect()),
                float(w.iter().map(|r| r.2).collect()),
            ],
        )?;
        let ctx = datafusion_grad::session_context_with_config(
            SessionConfig::new().with_target_partitions(2 + case % 2),
        );
        ctx.register_batch("x", xs)?;
        ctx.register_batch("w", ws)?;
        ctx.sql(
            "CREATE VIEW l AS SELECT sum(y * y) AS loss FROM (SELECT x.a, w.b, \
             sum(x.v * w.v) AS y FROM x JOIN w ON x.b = w.a GROUP BY x.a, w.b)",
        )
        .await?
        .collect()
        .await?;
        let sql = "SELECT w.a, w.b, w.v, grad((SELECT loss FROM l), w.v) AS g FROM w";
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        let shown = displayable(plan.as_ref()).indent(false).to_string();
        assert!(contracts(&shown), "case {case}: {shown}");
        let mut got: BTreeMap<(Option<i64>, i64), Option<f64>> = BTreeMap::new();
        for batch in collect(plan, ctx.task_ctx()).await? {
            let col = |c: usize| {
                batch
                    .column(c)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
            };
            let g = batch
                .column(3)
                .as_any()
                .downcast_ref::<Float64Array>()
                .unwrap();
            for row in 0..batch.num_rows() {
                let k = col(0).is_valid(row).then(|| col(0).value(row));
                let gradient = g.is_valid(row).then(|| g.value(row));
                got.insert((k, col(1).value(row)), gradient);
            }
        }
        assert_eq!(got.len(), w.len(), "case {case}");
        for (&(k, j, _), e) in w.iter().zip(&expected) {
            let g = got[&(k, j)];
            let same = match (g, e) {
                (Some(g), Some(e)) => (g - e).abs() <= 1e-9 * (1.0 + e.abs()),
                (None, None) => true,
                _ => false,
            };
            assert!(same, "case {case}, w row ({k:?}, {j}): {g:?} vs {e:?}");
        }
        let got = gradients(&ctx, "l", "x", x.len(), true).await?;
        same_gradients(&got, &expected_x, &format!("case {case}, x"));
    }
    Ok(())
}

/// A float column of `values`.
fn floats(values: impl IntoIterator<Item = Option<f64>>) -> ArrayRef {
    Arc::new(values.into_iter().collect::<Float64Array>())
}

/// An integer column of `values`.
fn ints(values: impl IntoIterator<Item = Option<i64>>) -> ArrayRef {
    Arc::new(values.into_iter().collect::<Int64Array>())
}

/// A row of a test relation: two keys and a value.
type Row = (Option<i64>, Option<i64>, Option<f64>);

/// `rows` rows of two keys drawn from `0..a` and `0..b` and a value from
/// `-2..2`, each NULL with probability `nulls`.
fn random_rows(rng: &mut StdRng, rows: usize, (a, b): (i64, i64), nulls: f64) -> Vec<Row> {
    fn maybe<T>(rng: &mut StdRng, nulls: f64, v: T) -> Option<T> {
        (!rng.random_bool(nulls)).then_some(v)
    }
    (0..rows)
        .map(|_| {
            let (x, y) = (rng.random_range(0..a), rng.random_range(0..b));
            let (x, y) = (maybe(rng, nulls, x), maybe(rng, nulls, y));
            let v = rng.random_range(-2.0..2.0);
            (x, y, maybe(rng, nulls, v))
        })
        .collect()
}

/// Registers `rows` as the table `name`: key columns named `keys`, then
/// `v` and the row's id `i`.
fn register(ctx: &SessionContext, name: &str, keys: [&str; 2], rows: &[Row]) -> Result<()> {
    let batch = RecordBatch::try_from_iter(vec![
        (keys[0], ints(rows.iter().map(|r| r.0))),
        (keys[1], ints(rows.iter().map(|r| r.1))),
        ("v", floats(rows.iter().map(|r| r.2))),
        ("i", ints((0..rows.len() as i64).map(Some))),
    ])?;
    ctx.register_batch(name, batch)?;
    Ok(())
}

/// Asserts that each gradient is the expected one to 1e-9 (relative),
/// NULL where it is expected NULL.
fn same_gradients(got: &[Option<f64>], expected: &[Option<f64>], what: &str) {
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let same = match (g, e) {
            (Some(g), Some(e)) => (g - e).abs() <= 1e-9 * (1.0 + e.abs()),
            (None, None) => true,
            _ => false,
        };
        assert!(same, "{what} row {i}: {g:?} vs {e:?}");
    }
}

/// Whether the plan `shown` runs a contraction outside its shared
/// subplans (each outlined on its `SharedExec` line): in a gradient's
/// plan, whether the backward pass does.
fn contracts(shown: &str) -> bool {
    shown
        .lines()
        .any(|l| l.trim_start().starts_with("ContractionExec"))
}

/// `grad(loss, {table}.v)` at each row of `table`, by its id `i`; whether
/// the backward pass contracts (see [`contracts`]) must be `contracted`.
async fn gradients(
    ctx: &SessionContext,
    loss: &str,
    table: &str,
    rows: usize,
    contracted: bool,
) -> Result<Vec<Option<f64>>> {
    let sql =
        format!("SELECT {table}.i, grad((SELECT loss FROM {loss}), {table}.v) AS g FROM {table}");
    let plan = ctx.sql(&sql).await?.create_physical_plan().await?;
    let shown = displayable(plan.as_ref()).indent(false).to_string();
    assert_eq!(contracts(&shown), contracted, "{sql}: {shown}");
    let mut got = vec![None; rows];
    for batch in collect(plan, ctx.task_ctx()).await? {
        let i = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let g = batch
            .column(1)
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap();
        for row in 0..batch.num_rows() {
            got[i.value(row) as usize] = Some(g.is_valid(row).then(|| g.value(row)));
        }
    }
    Ok(got.into_iter().map(|g| g.expect("every row")).collect())
}

/// Losses whose groups come from one side only (`GROUP BY x.a`: the
/// adjoints are a factor of x's rows, summed with w's rows for w), joined
/// by `=` or `IS NOT DISTINCT FROM`, with a condition on each side:
/// gradients with respect to both tables' rows against the sums written
/// out here (NULL keys match nothing under `=` and each other under `IS
/// NOT DISTINCT FROM`; NULL group keys are one group; NULL values send
/// nothing and have a NULL gradient).
#[tokio::test]
async fn gradients_through_groups_of_one_side_are_their_sums() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(474);
    for case in 0..12 {
        let nulls = [0.0, 0.15, 0.3][case % 3];
        let distinct = case % 2 == 1;
        // x(a, b, v, i), w(a, b, v, i): x.b meets w.a
        let rows = rng.random_range(1..200);
        let x = random_rows(&mut rng, rows, (6, 5), nulls);
        let rows = rng.random_range(1..40);
        let w = random_rows(&mut rng, rows, (5, 4), nulls);
        let meets = |xb: Option<i64>, wa: Option<i64>| match distinct {
            true => xb == wa,
            false => xb.is_some() && xb == wa,
        };
        // the conditions: x.v > -1.5 (NULL: false), w.b < 3
        let x_kept = |xv: Option<f64>| xv.is_some_and(|v| v > -1.5);
        let w_kept = |wb: Option<i64>| wb.is_some_and(|b| b < 3);
        // the joined rows (x, w indexes)
        let mut joined = vec![];
        for (xi, xr) in x.iter().enumerate().filter(|(_, r)| x_kept(r.2)) {
            for (wi, wr) in w.iter().enumerate().filter(|(_, r)| w_kept(r.1)) {
                if meets(xr.1, wr.0) {
                    joined.push((xi, wi));
                }
            }
        }
        let mut z: BTreeMap<Option<i64>, Option<f64>> = BTreeMap::new();
        for &(xi, wi) in &joined {
            let sum = z.entry(x[xi].0).or_insert(None);
            if let (Some(xv), Some(wv)) = (x[xi].2, w[wi].2) {
                *sum = Some(sum.unwrap_or(0.0) + xv * wv);
            }
        }
        // each row's gradient: 2·z times the other side's value, over the
        // joined rows it is in (NULL for a NULL value)
        let expected = |of_x: bool| -> Vec<Option<f64>> {
            let rows = if of_x { &x } else { &w };
            (0..rows.len())
                .map(|i| {
                    rows[i].2?;
                    let mut g = 0.0;
                    for &(xi, wi) in &joined {
                        let (mine, theirs) = if of_x { (xi, w[wi].2) } else { (wi, x[xi].2) };
                        if let (true, Some(t), Some(Some(z))) = (mine == i, theirs, z.get(&x[xi].0))
                        {
                            g += 2.0 * z * t;
                        }
                    }
                    Some(g)
                })
                .collect()
        };
        let (expected_x, expected_w) = (expected(true), expected(false));
        let partitions = 1 + case % 3;
        let ctx = datafusion_grad::session_context_with_config(
            SessionConfig::new().with_target_partitions(partitions),
        );
        for (name, rows) in [("x", &x), ("w", &w)] {
            register(&ctx, name, ["a", "b"], rows)?;
        }
        let on = match distinct {
            true => "x.b IS NOT DISTINCT FROM w.a",
            false => "x.b = w.a",
        };
        ctx.sql(&format!(
            "CREATE VIEW l AS SELECT sum(z * z) AS loss FROM (SELECT x.a, sum(x.v * w.v) AS z \
             FROM x JOIN w ON {on} WHERE x.v > -1.5 AND w.b < 3 GROUP BY x.a)"
        ))
        .await?
        .collect()
        .await?;
        // x's gradient: the adjoints of x's groups times w's sums per key
        // (a plain aggregate of w); w's: x's rows with their groups'
        // adjoints, summed per key (a contraction, in every partitioning:
        // in one partition, in place of DataFusion's single aggregate).
        for (table, expected, contracted) in [("x", &expected_x, false), ("w", &expected_w, true)] {
            let got = gradients(&ctx, "l", table, expected.len(), contracted).await?;
            same_gradients(&got, expected, &format!("case {case} ({on}), {table}"));
        }
    }
    Ok(())
}

/// A network's second layer `z(n, c) = Σ relu(h.s) · w.val` over `h JOIN w
/// ON h.j + 1 = w.i` (the input numbered past the bias, a key that is an
/// expression), `relu` written as `CASE WHEN s > 0 THEN s ELSE 0.0 END`
/// (0 for a NULL `s`), loss `Σ z²`: the gradient with respect to the rows
/// of `w` is `hᵀ · 2z` summed per row, and with respect to the rows of `h`
/// `2z · wᵀ` where `s > 0` (else 0), against the sums written out here
/// (NULL keys, values and sums, repeated rows). The `CASE` makes the
/// engine test the whole term `ā · relu(s) · w.val` for NULL; that test,
/// taken apart per factor, lets the pass sum over `h` and the adjoints
/// (grouped by the key expression) without the rows of `h ⋈ w`: a
/// contraction wherever the aggregate is partial. For `h`, the partial is
/// `CASE WHEN s > 0 THEN ā · w.val ELSE 0 END` (with the guards): the sums
/// of `ā · w.val` over `w` per key and sample, taken where `s > 0` (a
/// contraction of the adjoints with `w`), never the rows of `h ⋈ w`.
#[tokio::test]
async fn gradients_through_a_relu_layer_are_its_sums() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(4749);
    for case in 0..12 {
        let nulls = [0.0, 0.1, 0.25][case % 3];
        // h(n, j, v): samples n, hidden units j; w(i, c, v): inputs i = j + 1
        let rows = rng.random_range(1..150);
        let h = random_rows(&mut rng, rows, (12, 5), nulls);
        let rows = rng.random_range(1..30);
        let w = random_rows(&mut rng, rows, (6, 3), nulls);
        let relu = |s: Option<f64>| s.filter(|&s| s > 0.0).unwrap_or(0.0);
        let meets =
            |j: Option<i64>, i: Option<i64>| matches!((j, i), (Some(j), Some(i)) if j + 1 == i);
        // the joined rows (h, w indexes) and the groups' sums z(n, c)
        let mut joined = vec![];
        let mut z: BTreeMap<(Option<i64>, Option<i64>), Option<f64>> = BTreeMap::new();
        for (hi, hr) in h.iter().enumerate() {
            for (wi, wr) in w.iter().enumerate() {
                if meets(hr.1, wr.0) {
                    joined.push((hi, wi));
                    let sum = z.entry((hr.0, wr.1)).or_insert(None);
                    if let Some(wv) = wr.2 {
                        *sum = Some(sum.unwrap_or(0.0) + relu(hr.2) * wv);
                    }
                }
            }
        }
        let expected: Vec<Option<f64>> = (0..w.len())
            .map(|t| {
                w[t].2?;
                let mut g = 0.0;
                for &(hi, wi) in joined.iter().filter(|&&(_, wi)| wi == t) {
                    if let Some(Some(z)) = z.get(&(h[hi].0, w[wi].1)) {
                        g += 2.0 * z * relu(h[hi].2);
                    }
                }
                Some(g)
            })
            .collect();
        let partitions = 1 + case % 3;
        let ctx = datafusion_grad::session_context_with_config(
            SessionConfig::new().with_target_partitions(partitions),
        );
        register(&ctx, "h", ["n", "j"], &h)?;
        register(&ctx, "w", ["a", "b"], &w)?;
        ctx.sql(
            "CREATE VIEW l AS SELECT sum(z * z) AS loss FROM (SELECT h.n, w.b, \
             sum(CASE WHEN h.v > 0 THEN h.v ELSE 0.0 END * w.v) AS z \
             FROM h JOIN w ON h.j + 1 = w.a GROUP BY h.n, w.b)",
        )
        .await?
        .collect()
        .await?;
        let got = gradients(&ctx, "l", "w", w.len(), true).await?;
        same_gradients(&got, &expected, &format!("case {case}, w"));
        // h's rows: 2z · w.v over the joined rows whose z and w.v are not
        // NULL, where s > 0 (else 0); NULL for a NULL s.
        let expected: Vec<Option<f64>> = (0..h.len())
            .map(|t| {
                let s = h[t].2?;
                let mut g = 0.0;
                for &(_, wi) in joined.iter().filter(|&&(hi, _)| hi == t) {
                    if let (Some(Some(z)), Some(wv)) = (z.get(&(h[t].0, w[wi].1)), w[wi].2) {
                        if s > 0.0 {
                            g += 2.0 * z * wv;
                        }
                    }
                }
                Some(g)
            })
            .collect();
        let got = gradients(&ctx, "l", "h", h.len(), true).await?;
        same_gradients(&got, &expected, &format!("case {case}, h"));
    }
    Ok(())
}

/// Matrix factorization's block of three inputs: `p(a, b) = Σ u.v · f.v`
/// over `r JOIN u ON u.a = r.a JOIN f ON f.b = r.b AND f.k = u.k` (`=` or
/// `IS NOT DISTINCT FROM` for the factor keys), a condition on the ratings
/// and on each factor table (and in some cases one across the ratings and
/// `f`), loss `Σ p²`: gradients with respect to the rows of `u` and of `f`
/// (the rest of the block is two inputs joined) against the sums written
/// out here, NULL keys and values and repeated rows included.
#[tokio::test]
async fn gradients_of_a_factorization_are_its_sums() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(4747);
    for case in 0..24 {
        let nulls = [0.0, 0.1, 0.25][case % 3];
        let distinct = case % 2 == 1;
        // r(a, b, v): ratings of user a for item b; u(a, k, v); f(b, k, v)
        let r = random_rows(&mut rng, 60, (5, 4), nulls);
        let u = random_rows(&mut rng, 18, (5, 3), nulls);
        let f = random_rows(&mut rng, 14, (4, 3), nulls);
        // a condition across the ratings and f (for u's gradient, on the
        // rest; for f's, across it and the rest: the joined form)
        let across = (case / 4) % 2 == 1;
        let eq = |x: Option<i64>, y: Option<i64>| x.is_some() && x == y;
        let keyed = |x: Option<i64>, y: Option<i64>| match distinct {
            true => x == y,
            false => eq(x, y),
        };
        // the conditions: r.v > -1.8, u.v < 1.9, f.v > -1.9 (NULL: false)
        let r_kept = |v: Option<f64>| v.is_some_and(|v| v > -1.8);
        let u_kept = |v: Option<f64>| v.is_some_and(|v| v < 1.9);
        let f_kept = |v: Option<f64>| v.is_some_and(|v| v > -1.9);
        // the joined rows (r, u, f indexes)
        let mut joined = vec![];
        for (ri, rr) in r.iter().enumerate().filter(|(_, x)| r_kept(x.2)) {
            for (ui, ur) in u.iter().enumerate().filter(|(_, x)| u_kept(x.2)) {
                for (fi, fr) in f.iter().enumerate().filter(|(_, x)| f_kept(x.2)) {
                    let extra = !across || rr.2.zip(fr.2).is_some_and(|(x, y)| x + y < 3.5);
                    if eq(ur.0, rr.0) && eq(fr.0, rr.1) && keyed(fr.1, ur.1) && extra {
                        joined.push((ri, ui, fi));
                    }
                }
            }
        }
        let mut p: BTreeMap<(Option<i64>, Option<i64>), Option<f64>> = BTreeMap::new();
        for &(ri, ui, fi) in &joined {
            let sum = p.entry((r[ri].0, r[ri].1)).or_insert(None);
            if let (Some(x), Some(y)) = (u[ui].2, f[fi].2) {
                *sum = Some(sum.unwrap_or(0.0) + x * y);
            }
        }
        let expected = |of_u: bool| -> Vec<Option<f64>> {
            let rows = if of_u { &u } else { &f };
            (0..rows.len())
                .map(|i| {
                    rows[i].2?;
                    let mut g = 0.0;
                    for &(ri, ui, fi) in &joined {
                        let (mine, theirs) = if of_u { (ui, f[fi].2) } else { (fi, u[ui].2) };
                        if let (true, Some(t), Some(Some(z))) =
                            (mine == i, theirs, p.get(&(r[ri].0, r[ri].1)))
                        {
                            g += 2.0 * z * t;
                        }
                    }
                    Some(g)
                })
                .collect()
        };
        let partitions = 1 + case % 3;
        let ctx = datafusion_grad::session_context_with_config(
            SessionConfig::new().with_target_partitions(partitions),
        );
        for (name, rows, keys) in [
            ("r", &r, ["a", "b"]),
            ("u", &u, ["a", "k"]),
            ("f", &f, ["b", "k"]),
        ] {
            register(&ctx, name, keys, rows)?;
        }
        let k = match distinct {
            true => "f.k IS NOT DISTINCT FROM u.k",
            false => "f.k = u.k",
        };
        let extra = match across {
            true => "AND r.v + f.v < 3.5",
            false => "",
        };
        ctx.sql(&format!(
            "CREATE VIEW l AS SELECT sum(p * p) AS loss FROM (SELECT r.a, r.b, sum(u.v * f.v) AS p \
             FROM r JOIN u ON u.a = r.a JOIN f ON f.b = r.b AND {k} \
             WHERE r.v > -1.8 AND u.v < 1.9 AND f.v > -1.9 {extra} GROUP BY r.a, r.b)"
        ))
        .await?
        .collect()
        .await?;
        // each factor's gradient: a contraction of the ratings (with their
        // adjoints) and the other factor, where no condition reads both (for
        // u's, the sums' join then has a filter: the join + aggregate runs
        // them)
        for (table, expected) in [("u", expected(true)), ("f", expected(false))] {
            let contracted = !across;
            let got = gradients(&ctx, "l", table, expected.len(), contracted).await?;
            same_gradients(&got, &expected, &format!("case {case} ({k}), {table}"));
        }
    }
    Ok(())
}

/// Final sums that outgrow a memory pool: the contraction in final mode
/// gives the groups so far, and the rest's, as partial sums to DataFusion's
/// final aggregate (`merged_rows=` in the plan's metrics), which spills —
/// the join + aggregate's answer without a limit, every group once.
#[tokio::test]
async fn final_sums_under_memory_pressure_are_merged() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(4748);
    let x = relation(&mut rng, 60_000, Keys::Sparse(30_000), Keys::Dense(8), 0.0);
    let w = full(&mut rng, Keys::Dense(8), Keys::Dense(20), 0);
    let sql = "SELECT x.a, w.b, sum(x.v * w.v) FROM x JOIN w ON x.b = w.a GROUP BY x.a, w.b";
    // Two partitions (the probe rows hashed by their groups), and one
    // (DataFusion's aggregate in one step, replaced whole; all the sums in
    // one partition, whose pool is halved to keep them beyond it).
    for (partitions, limit) in [(2, MEMORY_LIMIT), (1, MEMORY_LIMIT / 2)] {
        let config = || SessionConfig::new().with_target_partitions(partitions);
        let ctx = datafusion_grad::session_context_with_config(config());
        for (name, batch) in [("x", &x), ("w", &w)] {
            register_parts(&ctx, name, batch, partitions)?;
        }
        ctx.sql("SET datafusion_grad.contraction = false")
            .await?
            .collect()
            .await?;
        let (expected, _) = answer(&ctx, sql, 2).await?;
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(limit, 1.0)
            .build_arc()?;
        let ctx = SessionContext::new_with_config_rt(config(), runtime);
        datafusion_grad::register(&ctx);
        for (name, batch) in [("x", &x), ("w", &w)] {
            register_parts(&ctx, name, batch, partitions)?;
        }
        let (got, plan) = answer(&ctx, sql, 2).await?;
        assert!(plan.contains("ContractionExec: mode=Final"), "{plan}");
        let merged = plan
            .split("merged_rows=")
            .skip(1)
            .any(|rest| !rest.starts_with('0'));
        assert!(merged, "{plan}");
        assert_same(&got, &expected, &format!("{sql}, {partitions} partitions"));
    }
    Ok(())
}

/// The memory pool of [`final_sums_under_memory_pressure_are_merged`]:
/// smaller than its 600,000 groups' sums, enough for the final aggregate
/// to spill them.
const MEMORY_LIMIT: usize = 10 << 20;
