//! The expression families of `benches/rewrite.rs`, shared with the test
//! that asserts their derivative sizes (`tests/sizes.rs`):
//! - `product`: `x1 · x2 · … · xn`, all n partials in one reverse sweep;
//! - `nested`: a composition of depth n, `sin(cos(tanh(… x)))`, one partial;
//! - `mlp`: a dense 2-layer network `Σⱼ vⱼ·tanh(Σᵢ wᵢⱼ·xᵢ + bⱼ)` written as
//!   scalar SQL, the partials for every weight.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::{col, lit, Expr};
use datafusion::prelude::{cos, sin, tanh};
use datafusion_grad::engine::{Seed, Workspace};
use datafusion_grad::Rules;

/// A differentiation problem: `f`, its variables, and the schema they live in.
pub struct Case {
    /// The expression.
    pub f: Expr,
    /// Its variables.
    pub wrt: Vec<Column>,
    /// The schema `f` is over.
    pub schema: DFSchema,
}

fn schema(names: &[String]) -> DFSchema {
    let fields: Vec<Field> = names
        .iter()
        .map(|n| Field::new(n, DataType::Float64, false))
        .collect();
    DFSchema::try_from(Arc::new(Schema::new(fields))).expect("valid schema")
}

/// `x0 · x1 · … · x(n-1)`, with respect to every factor.
pub fn product(n: usize) -> Case {
    let names: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
    let f = names.iter().map(col).reduce(|a, b| a * b).expect("n > 0");
    Case {
        f,
        wrt: names.iter().map(Column::from_name).collect(),
        schema: schema(&names),
    }
}

/// `sin`, `cos` and `tanh(0.5 ·)` composed `depth` deep over `x`.
pub fn nested(depth: usize) -> Case {
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

/// A dense 2-layer network, with respect to every weight.
pub fn mlp(inputs: usize, hidden: usize) -> Case {
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

/// The sizes of the derivative DAG: (forward nodes, derivative nodes).
pub fn dag_sizes(case: &Case, rules: &Rules) -> (usize, usize) {
    let mut ws = Workspace::new(&case.schema, rules);
    let forward = ws.intern(&case.f).expect("internable");
    let roots = ws
        .derivative(&case.f, &case.wrt, Seed::Grad)
        .expect("differentiable");
    (ws.graph().size(&[forward]), ws.graph().size(&roots))
}
