//! Planning time of derivatives up to third order of random expressions.
//!
//! For `--count` random expressions over `x`, `y` of at most `--max-nodes`
//! nodes (see `benches/expressions`), and for each the derivatives of order
//! 1, 2 and 3 (nested `grad`, each with respect to a variable drawn at
//! random), it times:
//! - `dfgrad`: planning the query, SQL text to physical plan, in a
//!   datafusion-grad session (what the `dfgrad` CLI does before running it);
//! - `stock`: planning the exported text (`rewrite_sql`, DataFusion dialect)
//!   in a stock DataFusion session (no datafusion-grad installed).
//!
//! It prints, per order, the largest and the median times, and the slowest
//! query with its figures, and fails (exit status 1) when a query fails to
//! plan or, run as a benchmark (`cargo bench` passes `--bench`), takes longer
//! than `--limit-ms` (default 1000) in either. Run once as a test (`cargo
//! test`, on a busy CI machine) it lists the queries over the limit without
//! failing: a speed target is met in a benchmark, not in a timed test.
//!
//! ```text
//! cargo bench --bench planning -- --count 300
//! # or with the test profile's build (dependencies optimized, shared with
//! # `cargo test`), the limit enforced as by `cargo bench`:
//! cargo test --bench planning -- --count 300 --bench
//! ```

mod expressions;

use std::time::Duration;

use expressions::{nested_grad, random_expression, time_query, Timing, FROM};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The settings read from the command line.
struct Settings {
    count: usize,
    seed: u64,
    max_nodes: usize,
    limit: Duration,
    /// Whether a query over `limit` fails the run (as a benchmark).
    enforce_limit: bool,
}

impl Settings {
    fn from_args() -> Self {
        let mut s = Settings {
            count: 200,
            seed: 45,
            max_nodes: 40,
            limit: Duration::from_millis(1000),
            enforce_limit: false,
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        let value = |i: usize| -> u64 {
            args.get(i + 1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{} needs a number", args[i]))
        };
        for (i, a) in args.iter().enumerate() {
            match a.as_str() {
                "--count" => s.count = value(i) as usize,
                "--seed" => s.seed = value(i),
                "--max-nodes" => s.max_nodes = value(i) as usize,
                "--limit-ms" => s.limit = Duration::from_millis(value(i)),
                "--bench" => s.enforce_limit = true,
                _ => {}
            }
        }
        s
    }
}

/// One query and what planning it took.
struct Measured {
    f: String,
    nodes: usize,
    sql: String,
    timing: Timing,
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn run(s: &Settings) -> bool {
    let ctx = datafusion_grad::session_context();
    let mut rng = StdRng::seed_from_u64(s.seed);
    let mut by_order: Vec<Vec<Measured>> = vec![Vec::new(), Vec::new(), Vec::new()];
    let mut failures = Vec::new();
    for _ in 0..s.count {
        let (f, nodes) = random_expression(&mut rng, s.max_nodes);
        let wrt: Vec<&str> = (0..3)
            .map(|_| if rng.random_bool(0.5) { "x" } else { "y" })
            .collect();
        for order in 1..=3 {
            let sql = format!("SELECT {} {FROM}", nested_grad(&f, &wrt[..order]));
            match time_query(&ctx, &sql).await {
                Ok(timing) => by_order[order - 1].push(Measured {
                    f: f.clone(),
                    nodes,
                    sql,
                    timing,
                }),
                Err(e) => failures.push(format!("{sql}: {e}")),
            }
        }
    }
    let mut ok = failures.is_empty();
    println!(
        "{} random expressions of at most {} nodes (seed {}), derivatives of order 1-3",
        s.count, s.max_nodes, s.seed
    );
    for (k, measured) in by_order.iter().enumerate() {
        let mut dfgrad: Vec<Duration> = measured.iter().map(|m| m.timing.dfgrad).collect();
        let mut stock: Vec<Duration> = measured.iter().map(|m| m.timing.stock).collect();
        dfgrad.sort();
        stock.sort();
        let median = |v: &[Duration]| v.get(v.len() / 2).copied().unwrap_or_default();
        let max = |v: &[Duration]| v.last().copied().unwrap_or_default();
        println!(
            "order {}: {} queries; dfgrad max {:.1} ms, median {:.1} ms; exported text in stock \
             DataFusion max {:.1} ms, median {:.1} ms",
            k + 1,
            measured.len(),
            millis(max(&dfgrad)),
            millis(median(&dfgrad)),
            millis(max(&stock)),
            millis(median(&stock)),
        );
        if let Some(worst) = measured
            .iter()
            .max_by_key(|m| m.timing.dfgrad.max(m.timing.stock))
        {
            let t = &worst.timing;
            println!(
                "  slowest: f = {} ({} nodes): dfgrad {:.1} ms, export {:.1} ms, stock {:.1} ms, \
                 {} characters of SQL",
                worst.f,
                worst.nodes,
                millis(t.dfgrad),
                millis(t.export),
                millis(t.stock),
                t.text_len
            );
        }
        for m in measured {
            if m.timing.dfgrad > s.limit || m.timing.stock > s.limit {
                ok &= !s.enforce_limit;
                println!(
                    "  over {} ms: {} (dfgrad {:.1} ms, stock {:.1} ms)",
                    s.limit.as_millis(),
                    m.sql,
                    millis(m.timing.dfgrad),
                    millis(m.timing.stock)
                );
            }
        }
    }
    for f in &failures {
        println!("failed: {f}");
    }
    ok
}

/// Runs on a thread with a large stack: DataFusion's expression walks recurse.
fn main() {
    let settings = Settings::from_args();
    let ok = std::thread::Builder::new()
        .stack_size(1 << 30)
        .spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime")
                .block_on(run(&settings))
        })
        .expect("spawn the benchmark thread")
        .join()
        .expect("the benchmark ran");
    if !ok {
        std::process::exit(1);
    }
}
