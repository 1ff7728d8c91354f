//! Runs every `sql-tests/*.slt` file (sqllogictest format) against a fresh
//! datafusion-grad session. Floats are printed rounded to 10 decimal places,
//! NULL as `NULL`; pass file-name filters as arguments to run a subset.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, Float32Array, Float64Array, UInt64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use sqllogictest::{DBOutput, DefaultColumnType};

struct Grad {
    ctx: SessionContext,
}

fn float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let s = format!("{v:.10}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

fn cell(col: &ArrayRef, row: usize) -> Result<String, DataFusionError> {
    if col.is_null(row) {
        return Ok("NULL".into());
    }
    Ok(match col.data_type() {
        DataType::Float64 => float(
            col.as_any()
                .downcast_ref::<Float64Array>()
                .unwrap()
                .value(row),
        ),
        DataType::Float32 => float(
            col.as_any()
                .downcast_ref::<Float32Array>()
                .unwrap()
                .value(row) as f64,
        ),
        _ => ArrayFormatter::try_new(col.as_ref(), &FormatOptions::default())?
            .value(row)
            .to_string(),
    })
}

/// A row whose last cell has several lines (an EXPLAIN plan) as one
/// single-cell row per line, the other cells before the first line, and
/// each line's indentation written as `-` (sqllogictest compares rows as
/// their cells joined by spaces): as DataFusion's own `.slt` files show
/// plans.
fn plan_lines(row: Vec<String>) -> Vec<Vec<String>> {
    let Some((last, first)) = row.split_last() else {
        return vec![row];
    };
    if !last.contains('\n') {
        return vec![row];
    }
    last.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            let text = line.trim_start();
            let indent = "-".repeat(line.len() - text.len());
            let line = format!("{indent}{text}");
            match i {
                0 => vec![[first.join(" "), line].join(" ")],
                _ => vec![line],
            }
        })
        .collect()
}

fn column_type(t: &DataType) -> DefaultColumnType {
    match t {
        t if t.is_floating() || matches!(t, DataType::Decimal128(..)) => {
            DefaultColumnType::FloatingPoint
        }
        t if t.is_integer() => DefaultColumnType::Integer,
        _ => DefaultColumnType::Text,
    }
}

#[async_trait]
impl sqllogictest::AsyncDB for Grad {
    type Error = DataFusionError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, DataFusionError> {
        let df = self.ctx.sql(sql).await?;
        let schema = df.schema().clone();
        let batches = df.collect().await?;
        let is_statement = schema.fields().is_empty()
            || (schema.fields().len() == 1
                && schema.field(0).name() == "count"
                && !sql.trim_start().to_ascii_lowercase().starts_with("select")
                && !sql.trim_start().to_ascii_lowercase().starts_with("with"));
        if is_statement {
            // DML reports its row count (`statement count N`).
            let count = batches
                .iter()
                .filter(|b| b.num_columns() == 1)
                .filter_map(|b| b.column(0).as_any().downcast_ref::<UInt64Array>())
                .flat_map(|a| a.iter().flatten())
                .sum();
            return Ok(DBOutput::StatementComplete(count));
        }
        let types = schema
            .fields()
            .iter()
            .map(|f| column_type(f.data_type()))
            .collect();
        let mut rows = Vec::new();
        for batch in &batches {
            for r in 0..batch.num_rows() {
                let row = batch
                    .columns()
                    .iter()
                    .map(|c| cell(c, r))
                    .collect::<Result<Vec<_>, _>>()?;
                rows.extend(plan_lines(row));
            }
        }
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "datafusion-grad"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }
}

#[cfg(feature = "cuda")]
fn gpu_available() -> bool {
    datafusion_grad::tensor::cuda::available()
}

#[cfg(not(feature = "cuda"))]
fn gpu_available() -> bool {
    false
}

#[tokio::main]
async fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql-tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("sql-tests/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .filter(|p| filters.is_empty() || filters.iter().any(|f| p.to_string_lossy().contains(f)))
        .collect();
    files.sort();
    let (mut passed, mut failed) = (0, 0);
    for file in &files {
        let mut runner = sqllogictest::Runner::new(|| async {
            Ok::<_, DataFusionError>(Grad {
                ctx: datafusion_grad::session_context(),
            })
        });
        // `cuda`: built with the cuda feature; `gpu`: a CUDA device is usable.
        if cfg!(feature = "cuda") {
            runner.add_label("cuda");
        }
        if gpu_available() {
            runner.add_label("gpu");
        } else if std::env::var("DFGRAD_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            panic!("DFGRAD_REQUIRE_GPU=1 but no CUDA device can be used");
        }
        match runner.run_file_async(file).await {
            Ok(()) => {
                passed += 1;
                println!("ok   {}", file.display());
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {}\n{e}", file.display());
            }
        }
    }
    println!("sqllogictest: {passed} passed, {failed} failed");
    if failed > 0 || files.is_empty() {
        std::process::exit(1);
    }
}
