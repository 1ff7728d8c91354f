//! Rewrite latency and derivative size of the differentiation engine.
//!
//! Families (each at several sizes):
//! - `product`: `x1 · x2 · … · xn`, all n partials in one reverse sweep;
//! - `nested`: a composition of depth n, `sin(cos(tanh(… x)))`, one partial;
//! - `mlp`: a dense 2-layer network `Σⱼ vⱼ·tanh(Σᵢ wᵢⱼ·xᵢ + bⱼ)` written as
//!   scalar SQL, the partials for every weight.
//!
//! Timed per case: `dag`, differentiation into the hash-consed DAG (the
//! engine's rewrite: `f` interned, typed, swept; every partial built), and `shared`, that plus emitting it as the analyzer
//! does, with shared subexpressions bound to columns of binding projections
//! ([`differentiate_shared`]; skipped where the emission is refused as too
//! large). Before timing, each case prints `derivative DAG nodes / forward
//! DAG nodes` (all partials together), and the emitted expression nodes (all
//! projections and derivative expressions together) over the forward nodes.
//! Run with `cargo bench --bench rewrite`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::{col, lit, Expr};
use datafusion::prelude::{cos, sin, tanh};
use datafusion_grad::engine::{differentiate_shared, Derivative, Seed, Shared, Workspace};
use datafusion_grad::Rules;

/// A differentiation problem: `f`, its variables, and the schema they live in.
struct Case {
    f: Expr,
    wrt: Vec<Column>,
    schema: DFSchema,
}

fn schema(names: &[String]) -> DFSchema {
    let fields: Vec<Field> = names
        .iter()
        .map(|n| Field::new(n, DataType::Float64, false))
        .collect();
    DFSchema::try_from(Arc::new(Schema::new(fields))).expect("valid schema")
}

fn product(n: usize) -> Case {
    let names: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
    let f = names.iter().map(col).reduce(|a, b| a * b).expect("n > 0");
    Case {
        f,
        wrt: names.iter().map(Column::from_name).collect(),
        schema: schema(&names),
    }
}

fn nested(depth: usize) -> Case {
    let mut f = col("x");
    for i in 0..depth {
        f = match i % 3 {
            0 => sin(f),
            1 => cos(f),
            _ => tanh(f * lit(0.5)),
        };
    }
    Case {
        f,
        wrt: vec![Column::from_name("x")],
        schema: schema(&["x".to_string()]),
    }
}

fn mlp(inputs: usize, hidden: usize) -> Case {
    let mut names: Vec<String> = (0..inputs).map(|i| format!("x{i}")).collect();
    let mut weights = Vec::new();
    let mut out = Vec::new();
    for j in 0..hidden {
        let mut pre = col(format!("b{j}"));
        weights.push(format!("b{j}"));
        for i in 0..inputs {
            let w = format!("w{i}_{j}");
            pre = pre + col(&w) * col(format!("x{i}"));
            weights.push(w);
        }
        let v = format!("v{j}");
        out.push(col(&v) * tanh(pre));
        weights.push(v);
    }
    let f = out.into_iter().reduce(|a, b| a + b).expect("hidden > 0");
    names.extend(weights.iter().cloned());
    Case {
        f,
        wrt: weights.iter().map(Column::from_name).collect(),
        schema: schema(&names),
    }
}

/// The derivative as a DAG (what is timed): `f` interned and differentiated.
fn dag(case: &Case, rules: &Rules) -> Vec<usize> {
    let mut ws = Workspace::new(&case.schema, rules);
    ws.derivative(&case.f, &case.wrt, Seed::Grad)
        .expect("differentiable")
}

/// The sizes of the derivative DAG: (forward nodes, derivative nodes).
fn dag_sizes(case: &Case, rules: &Rules) -> (usize, usize) {
    let mut ws = Workspace::new(&case.schema, rules);
    let forward = ws.intern(&case.f).expect("internable");
    let roots = ws
        .derivative(&case.f, &case.wrt, Seed::Grad)
        .expect("differentiable");
    (ws.graph().size(&[forward]), ws.graph().size(&roots))
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
