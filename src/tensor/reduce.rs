//! Tensor reductions: to a number (`tensor_total`, `tensor_mean`, `norm`,
//! `dot`), over a matrix's rows (`col_sum`), and the piecewise constant
//! `argmax`.

use datafusion::common::ScalarValue;
use datafusion::error::Result;

use super::function::{mismatch, Spec};
use super::kernels;
use super::shape::Shape;

/// The reductions.
pub static SPECS: &[Spec] = &[
    Spec {
        name: "tensor_total",
        description: "The sum of a tensor's elements.",
        syntax: "tensor_total(t)",
        example: "SELECT tensor_total(tensor([1.0, 2.0, 3.0], 3)); -- 6.0",
        arity: 1..=1,
        shape: to_number,
        eval: |b| Ok(b.per_row(|i, out| out[0] = kernels::sum(b.args[0].row(i)))),
    },
    Spec {
        name: "tensor_mean",
        description: "The mean of a tensor's elements.",
        syntax: "tensor_mean(t)",
        example: "SELECT tensor_mean(tensor([1.0, 2.0, 3.0], 3)); -- 2.0",
        arity: 1..=1,
        shape: to_number,
        eval: |b| {
            let n = b.args[0].shape.size() as f64;
            Ok(b.per_row(|i, out| out[0] = kernels::sum(b.args[0].row(i)) / n))
        },
    },
    Spec {
        name: "norm",
        description: "The Euclidean (Frobenius for matrices) norm of a tensor.",
        syntax: "norm(t)",
        example: "SELECT norm(tensor([3.0, 4.0], 2)); -- 5.0",
        arity: 1..=1,
        shape: to_number,
        eval: |b| {
            Ok(b.per_row(|i, out| {
                let r = b.args[0].row(i);
                out[0] = kernels::dot(r, r).sqrt()
            }))
        },
    },
    Spec {
        name: "dot",
        description: "The inner product of two tensors of one shape (the dot product of vectors).",
        syntax: "dot(a, b)",
        example: "SELECT dot(tensor([1.0, 2.0], 2), tensor([3.0, 4.0], 2)); -- 11.0",
        arity: 2..=2,
        shape: |s, _| match s {
            [a, b] if a == b && a.is_tensor() => Ok(Shape::Scalar),
            [a, b] => mismatch("dot", format!("needs two tensors of one shape, got {a} and {b}")),
            _ => unreachable!("arity checked"),
        },
        eval: |b| Ok(b.per_row(|i, out| out[0] = kernels::dot(b.args[0].row(i), b.args[1].row(i)))),
    },
    Spec {
        name: "col_sum",
        description: "The sum of a matrix's rows: a vector with one total per column (the cotangent of a vector broadcast over the rows).",
        syntax: "col_sum(m)",
        example: "SELECT col_sum(tensor([1.0, 2.0, 3.0, 4.0], 2, 2)); -- [4.0, 6.0]",
        arity: 1..=1,
        shape: |s, _| match s[0] {
            Shape::Matrix(_, c) => Ok(Shape::Vector(c)),
            a => mismatch("col_sum", format!("needs a matrix, got {a}")),
        },
        eval: |b| {
            let (_, c) = b.args[0].shape.rows_cols();
            Ok(b.per_row(|i, out| {
                for row in b.args[0].row(i).chunks_exact(c) {
                    kernels::axpy(1.0, row, out);
                }
            }))
        },
    },
    Spec {
        name: "argmax",
        description: "The 0-based index of a vector's largest element (the first of ties), or of each matrix row's. Piecewise constant: its derivative is 0.",
        syntax: "argmax(t)",
        example: "SELECT argmax(tensor([1.0, 5.0, 2.0], 3)); -- 1.0",
        arity: 1..=1,
        shape: |s, _| match s[0] {
            Shape::Vector(_) => Ok(Shape::Scalar),
            Shape::Matrix(r, _) => Ok(Shape::Vector(r)),
            Shape::Scalar => mismatch("argmax", "needs a tensor, got a number"),
        },
        eval: |b| {
            let (_, cols) = b.args[0].shape.rows_cols();
            Ok(b.per_row(|i, out| {
                for (o, row) in out.iter_mut().zip(b.args[0].row(i).chunks_exact(cols)) {
                    *o = argmax(row) as f64;
                }
            }))
        },
    },
];

/// The shape of a full reduction of a tensor.
fn to_number(s: &[Shape], _: &[Option<&ScalarValue>]) -> Result<Shape> {
    if !s[0].is_tensor() {
        return mismatch("a tensor reduction", "needs a tensor, got a number");
    }
    Ok(Shape::Scalar)
}

/// Index of the largest element, the first of ties; NaN counts as largest.
pub fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > row[best] || (v.is_nan() && !row[best].is_nan()) {
            best = j;
        }
    }
    best
}
