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
use datafusion::physical_plan::{collect, displayable};
use datafusion::prelude::*;
use rand::rngs::StdRng;
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

/// The rows of `sql` by their group columns (the first `groups`), each
/// with its sums; and whether the plan has a `ContractionExec`.
async fn answer(
    ctx: &SessionContext,
    sql: &str,
    groups: usize,
) -> Result<(BTreeMap<Vec<String>, Vec<Option<f64>>>, bool)> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let contracted = displayable(plan.as_ref())
        .indent(false)
        .to_string()
        .contains("ContractionExec");
    let batches = collect(plan, ctx.task_ctx()).await?;
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
    Ok((rows, contracted))
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
    ];
    let mut rng = StdRng::seed_from_u64(47);
    let mut contracted = 0;
    for case in 0..24 {
        let (n, d, h) = (
            rng.random_range(1..40),
            rng.random_range(1..12),
            rng.random_range(1..300),
        );
        let kinds = [Keys::Dense(d), Keys::Sparse(d), Keys::Strings(d)];
        let kd = kinds[case % 3];
        let nulls = [0.0, 0.05, 0.3][case / 3 % 3];
        let (x_rows, w_rows) = (rng.random_range(0..400), rng.random_range(0..200));
        let x = relation(&mut rng, x_rows, Keys::Dense(n), kd, nulls);
        let w = relation(&mut rng, w_rows, kd, Keys::Sparse(h), nulls);
        for partitions in [1, 3] {
            let ctx = datafusion_grad::session_context_with_config(
                SessionConfig::new().with_target_partitions(partitions),
            );
            for (name, batch) in [("x", &x), ("w", &w)] {
                let halves = vec![
                    vec![batch.slice(0, batch.num_rows() / 2)],
                    vec![batch.slice(
                        batch.num_rows() / 2,
                        batch.num_rows() - batch.num_rows() / 2,
                    )],
                ];
                ctx.register_table(name, Arc::new(MemTable::try_new(batch.schema(), halves)?))?;
            }
            for &(sql, groups) in queries {
                let (on, used) = answer(&ctx, sql, groups).await?;
                ctx.sql("SET datafusion_grad.contraction = false")
                    .await?
                    .collect()
                    .await?;
                let (off, used_off) = answer(&ctx, sql, groups).await?;
                ctx.sql("SET datafusion_grad.contraction = true")
                    .await?
                    .collect()
                    .await?;
                assert!(!used_off);
                contracted += used as usize;
                assert_eq!(
                    on.keys().collect::<Vec<_>>(),
                    off.keys().collect::<Vec<_>>(),
                    "case {case}, {partitions} partitions: {sql}"
                );
                for (key, sums) in &on {
                    for (a, b) in sums.iter().zip(&off[key]) {
                        let same = match (a, b) {
                            (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                            (None, None) => true,
                            _ => false,
                        };
                        assert!(same, "case {case}, {key:?}: {a:?} vs {b:?}: {sql}");
                    }
                }
            }
        }
    }
    // The operator ran (more than half of the cases plan a partial
    // aggregate over a hash join).
    assert!(contracted > 24 * queries.len() / 2, "{contracted}");
    Ok(())
}
