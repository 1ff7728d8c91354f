//! Rewrite latency and derivative size of the differentiation engine.
//!
//! The families of `benches/families` (`product`, `nested`, `mlp`), each at
//! several sizes.
//!
//! Timed per case: `dag`, differentiation into the hash-consed DAG (the
//! engine's rewrite: `f` interned, typed, swept; every partial built), and `shared`, that plus emitting it as the analyzer
//! does, with shared subexpressions bound to columns of binding projections
//! ([`differentiate_shared`]; skipped where the emission is refused as too
//! large). Before timing, each case prints `derivative DAG nodes / forward
//! DAG nodes` (all partials together), and the emitted expression nodes (all
//! projections and derivative expressions together) over the forward nodes.
//! Run with `cargo bench --bench rewrite`.

mod families;

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::Expr;
use datafusion_grad::engine::{differentiate_shared, Derivative, Seed, Shared, Workspace};
use datafusion_grad::Rules;
use families::{dag_sizes, mlp, nested, product, Case};

/// The derivative as a DAG (what is timed): `f` interned and differentiated.
fn dag(case: &Case, rules: &Rules) -> Vec<usize> {
    let mut ws = Workspace::new(&case.schema, rules);
    ws.derivative(&case.f, &case.wrt, Seed::Grad)
        .expect("differentiable")
}

/// The derivative as the analyzer emits it, with shared parts bound.
fn shared(case: &Case, rules: &Rules) -> datafusion::error::Result<(Shared, Derivative)> {
    differentiate_shared(
        &case.f,
        &case.wrt,
        Seed::Grad,
        &case.schema,
        rules,
        "__bound_",
    )
}

/// Nodes of the expression trees of `exprs`.
fn tree_nodes<'a>(exprs: impl Iterator<Item = &'a Expr>) -> usize {
    let mut n = 0;
    for e in exprs {
        e.apply(|_| {
            n += 1;
            Ok(TreeNodeRecursion::Continue)
        })
        .expect("counting cannot fail");
    }
    n
}

fn bench_family(c: &mut Criterion, family: &str, cases: Vec<(usize, Case)>) {
    let rules = Rules::builtin();
    let mut group = c.benchmark_group(family);
    for (size, case) in &cases {
        let (forward, derivative) = dag_sizes(case, &rules);
        let emitted = match shared(case, &rules) {
            Ok((s, _)) => format!(
                "emitted {} nodes in {} binding projections (ratio {:.2})",
                tree_nodes(
                    s.layers
                        .iter()
                        .flat_map(|l| l.defined.iter().map(|(_, e)| e))
                        .chain(&s.exprs)
                ),
                s.layers.len(),
                tree_nodes(
                    s.layers
                        .iter()
                        .flat_map(|l| l.defined.iter().map(|(_, e)| e))
                        .chain(&s.exprs)
                ) as f64
                    / forward as f64
            ),
            Err(e) => format!(
                "emission refused: {}",
                e.to_string().lines().next().unwrap_or("")
            ),
        };
        println!(
            "{family}/{size}: forward {forward} nodes, derivative DAG {derivative} nodes, \
             DAG ratio {:.2}; {emitted}",
            derivative as f64 / forward as f64,
        );
        group.bench_with_input(BenchmarkId::new("dag", size), case, |b, case| {
            b.iter(|| black_box(dag(case, &rules)))
        });
        if shared(case, &rules).is_ok() {
            group.bench_with_input(BenchmarkId::new("shared", size), case, |b, case| {
                b.iter(|| black_box(shared(case, &rules)))
            });
        }
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_family(
        c,
        "product",
        [10, 100, 1000, 5000].map(|n| (n, product(n))).into(),
    );
    bench_family(
        c,
        "nested",
        [100, 1000, 6000].map(|n| (n, nested(n))).into(),
    );
    bench_family(
        c,
        "mlp",
        [(4, 8), (16, 32), (40, 80)]
            .map(|(i, h)| (i * h, mlp(i, h)))
            .into(),
    );
}

/// Runs the benchmarks on a thread with a large stack: DataFusion's own
/// expression walks (type and nullability of `f`) recurse, and the `nested`
/// family is 1,000 levels deep (and the `product` family has 10,000 nodes).
fn main() {
    std::thread::Builder::new()
        .stack_size(1 << 30)
        .spawn(|| {
            let mut c = Criterion::default().sample_size(20).configure_from_args();
            benches(&mut c);
            c.final_summary();
        })
        .expect("spawn the benchmark thread")
        .join()
        .expect("benchmarks ran");
}
