//! Functions along the last axis (a vector, or each row of a matrix):
//! `softmax`, `log_softmax`, `logsumexp`, `cross_entropy`, and the fused
//! products their derivative rules use (`softmax_vjp`, `log_softmax_vjp`,
//! `log_softmax_jvp`, `cross_entropy_grad`, `row_scale`, `row_dot`).

use datafusion::common::ScalarValue;
use datafusion::error::Result;

use super::function::{class_indices, mismatch, Batch, Spec};
use super::kernels;
use super::shape::Shape;

/// The row-wise functions.
pub static SPECS: &[Spec] = &[
    Spec {
        name: "softmax",
        description: "exp(x) / sum(exp(x)) along the last axis (each row of a matrix), computed stably.",
        syntax: "softmax(t)",
        example: "SELECT softmax(tensor([0.0, 0.0], 2)); -- [0.5, 0.5]",
        arity: 1..=1,
        shape: tensor_shape,
        eval: |b| Ok(rows_map(b, |z, out| {
            let m = kernels::max(z);
            kernels::map(z, out, |v| (v - m).exp());
            let s = kernels::sum(out);
            for v in out.iter_mut() {
                *v /= s;
            }
        })),
    },
    Spec {
        name: "log_softmax",
        description: "x - logsumexp(x) along the last axis (each row of a matrix), computed stably.",
        syntax: "log_softmax(t)",
        example: "SELECT log_softmax(tensor([0.0, 0.0], 2)); -- [-0.6931471805599453, -0.6931471805599453]",
        arity: 1..=1,
        shape: tensor_shape,
        eval: |b| Ok(rows_map(b, |z, out| {
            let l = logsumexp(z);
            kernels::add_scalar(z, -l, out);
        })),
    },
    Spec {
        name: "logsumexp",
        description: "ln(sum(exp(x))) of a vector (a number), or of each matrix row (a vector), computed stably.",
        syntax: "logsumexp(t)",
        example: "SELECT logsumexp(tensor([0.0, 0.0], 2)); -- 0.6931471805599453",
        arity: 1..=1,
        shape: |s, _| row_reduced("logsumexp", s[0]),
        eval: |b| Ok(rows_reduce(b, logsumexp)),
    },
    Spec {
        name: "row_dot",
        description: "The dot product of two vectors, or of each pair of rows of two matrices of one shape (a vector).",
        syntax: "row_dot(a, b)",
        example: "SELECT row_dot(tensor([1.0, 2.0, 3.0, 4.0], 2, 2), tensor([1.0, 1.0, 1.0, 1.0], 2, 2)); -- [3.0, 7.0]",
        arity: 2..=2,
        shape: |s, _| match s {
            [a, b] if a == b => row_reduced("row_dot", *a),
            [a, b] => mismatch("row_dot", format!("needs two tensors of one shape, got {a} and {b}")),
            _ => unreachable!("arity checked"),
        },
        eval: |b| {
            let (_, c) = b.args[0].shape.rows_cols();
            Ok(b.per_row(|i, out| {
                let pairs = b.args[0].row(i).chunks_exact(c).zip(b.args[1].row(i).chunks_exact(c));
                for (o, (x, y)) in out.iter_mut().zip(pairs) {
                    *o = kernels::dot(x, y);
                }
            }))
        },
    },
    Spec {
        name: "row_scale",
        description: "A vector times a number, or each row i of a matrix times element i of a vector.",
        syntax: "row_scale(t, s)",
        example: "SELECT row_scale(tensor([1.0, 2.0, 3.0, 4.0], 2, 2), tensor([10.0, 0.5], 2)); -- [[10.0, 20.0], [1.5, 2.0]]",
        arity: 2..=2,
        shape: |s, _| match s {
            [t, f] if row_reduced("row_scale", *t).ok() == Some(*f) => Ok(*t),
            [a, b] => mismatch("row_scale", format!("needs a vector and a number, or an r×c matrix and a vector of r, got {a} and {b}")),
            _ => unreachable!("arity checked"),
        },
        eval: |b| {
            let (_, c) = b.args[0].shape.rows_cols();
            Ok(b.per_row(|i, out| {
                let factors = b.args[1].row(i);
                for ((o, t), &f) in out.chunks_exact_mut(c).zip(b.args[0].row(i).chunks_exact(c)).zip(factors) {
                    kernels::scale(t, f, o);
                }
            }))
        },
    },
    Spec {
        name: "softmax_vjp",
        description: "y ⊙ (g - row_dot(y, g)) for y = softmax(x): the product of softmax's (symmetric) Jacobian with g, row by row.",
        syntax: "softmax_vjp(y, g)",
        example: "SELECT softmax_vjp(tensor([0.5, 0.5], 2), tensor([1.0, 0.0], 2)); -- [0.25, -0.25]",
        arity: 2..=2,
        shape: same_pair,
        eval: |b| Ok(rows_pair(b, |y, g, out| {
            let d = kernels::dot(y, g);
            for ((o, &yv), &gv) in out.iter_mut().zip(y).zip(g) {
                *o = yv * (gv - d);
            }
        })),
    },
    Spec {
        name: "log_softmax_vjp",
        description: "g - exp(y)·sum(g) for y = log_softmax(x): the cotangent of x, row by row.",
        syntax: "log_softmax_vjp(y, g)",
        example: "SELECT log_softmax_vjp(log_softmax(tensor([0.0, 0.0], 2)), tensor([1.0, 0.0], 2)); -- [0.5, -0.5]",
        arity: 2..=2,
        shape: same_pair,
        eval: |b| Ok(rows_pair(b, |y, g, out| {
            let s = kernels::sum(g);
            for ((o, &yv), &gv) in out.iter_mut().zip(y).zip(g) {
                *o = gv - yv.exp() * s;
            }
        })),
    },
    Spec {
        name: "log_softmax_jvp",
        description: "t - row_dot(exp(y), t) for y = log_softmax(x): the tangent of y, row by row.",
        syntax: "log_softmax_jvp(y, t)",
        example: "SELECT log_softmax_jvp(log_softmax(tensor([0.0, 0.0], 2)), tensor([1.0, 0.0], 2)); -- [0.5, -0.5]",
        arity: 2..=2,
        shape: same_pair,
        eval: |b| Ok(rows_pair(b, |y, t, out| {
            let d: f64 = y.iter().zip(t).map(|(&yv, &tv)| yv.exp() * tv).sum();
            kernels::add_scalar(t, -d, out);
        })),
    },
    Spec {
        name: "cross_entropy",
        description: "Softmax cross-entropy: logsumexp(z) - z[label] for a vector of logits z and a 0-based class label, or its mean over the rows of a matrix of logits with a vector of labels.",
        syntax: "cross_entropy(logits, label)",
        example: "SELECT cross_entropy(tensor([0.0, 0.0], 2), 1); -- 0.6931471805599453",
        arity: 2..=2,
        shape: |s, _| labels_shape("cross_entropy", s).map(|_| Shape::Scalar),
        eval: |b| {
            let (r, c) = b.args[0].shape.rows_cols();
            let mut out = vec![0.0; b.rows];
            for (i, o) in out.iter_mut().enumerate() {
                if !b.is_valid(i) {
                    continue;
                }
                let labels = class_indices("cross_entropy", b.args[1].row(i), c)?;
                let z = b.args[0].row(i);
                let total: f64 = z.chunks_exact(c).zip(&labels).map(|(row, &l)| logsumexp(row) - row[l]).sum();
                *o = total / r as f64;
            }
            Ok(out)
        },
    },
    Spec {
        name: "cross_entropy_grad",
        description: "The gradient of cross_entropy(logits, label) with respect to the logits: (softmax(z) - one_hot(label)) / rows.",
        syntax: "cross_entropy_grad(logits, label)",
        example: "SELECT cross_entropy_grad(tensor([0.0, 0.0], 2), 1); -- [0.5, -0.5]",
        arity: 2..=2,
        shape: |s, _| labels_shape("cross_entropy_grad", s).map(|_| s[0]),
        eval: |b| {
            let (r, c) = b.args[0].shape.rows_cols();
            let size = r * c;
            let mut out = vec![0.0; b.rows * size];
            for (i, o) in out.chunks_exact_mut(size).enumerate() {
                if !b.is_valid(i) {
                    continue;
                }
                let labels = class_indices("cross_entropy", b.args[1].row(i), c)?;
                for ((orow, z), &l) in o.chunks_exact_mut(c).zip(b.args[0].row(i).chunks_exact(c)).zip(&labels) {
                    let m = kernels::max(z);
                    kernels::map(z, orow, |v| (v - m).exp());
                    let s = kernels::sum(orow);
                    for v in orow.iter_mut() {
                        *v /= s * r as f64;
                    }
                    orow[l] -= 1.0 / r as f64;
                }
            }
            Ok(out)
        },
    },
];

/// Stable ln Σ exp.
fn logsumexp(z: &[f64]) -> f64 {
    let m = kernels::max(z);
    if m.is_infinite() {
        return m;
    }
    m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
}

fn tensor_shape(s: &[Shape], _: &[Option<&ScalarValue>]) -> Result<Shape> {
    match s[0] {
        Shape::Scalar => mismatch("a row-wise function", "needs a tensor, got a number"),
        t => Ok(t),
    }
}

fn same_pair(s: &[Shape], _: &[Option<&ScalarValue>]) -> Result<Shape> {
    match s {
        [a, b] if a == b && a.is_tensor() => Ok(*a),
        [a, b] => mismatch(
            "a row-wise product",
            format!("needs two tensors of one shape, got {a} and {b}"),
        ),
        _ => unreachable!("arity checked"),
    }
}

/// The shape of a reduction along the last axis of `t`.
fn row_reduced(function: &str, t: Shape) -> Result<Shape> {
    match t {
        Shape::Vector(_) => Ok(Shape::Scalar),
        Shape::Matrix(r, _) => Ok(Shape::Vector(r)),
        Shape::Scalar => mismatch(function, "needs a tensor, got a number"),
    }
}

/// Checks a (logits, labels) pair: one label per row of logits.
fn labels_shape(function: &str, s: &[Shape]) -> Result<Shape> {
    let want = row_reduced(function, s[0])?;
    if s[1] != want {
        return mismatch(
            function,
            format!("logits {} need labels of shape {want}, got {}", s[0], s[1]),
        );
    }
    Ok(want)
}

/// `f(row, out row)` along the last axis of argument 0, into a tensor of its shape.
fn rows_map(b: &Batch, f: impl Fn(&[f64], &mut [f64])) -> Vec<f64> {
    let (_, c) = b.args[0].shape.rows_cols();
    b.per_row(|i, out| {
        for (o, z) in out
            .chunks_exact_mut(c)
            .zip(b.args[0].row(i).chunks_exact(c))
        {
            f(z, o);
        }
    })
}

/// `f(row)` along the last axis of argument 0, one number per row.
fn rows_reduce(b: &Batch, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let (_, c) = b.args[0].shape.rows_cols();
    b.per_row(|i, out| {
        for (o, z) in out.iter_mut().zip(b.args[0].row(i).chunks_exact(c)) {
            *o = f(z);
        }
    })
}

/// `f(row of a, row of b, out row)` along the last axis of two tensors of one shape.
fn rows_pair(b: &Batch, f: impl Fn(&[f64], &[f64], &mut [f64])) -> Vec<f64> {
    let (_, c) = b.args[0].shape.rows_cols();
    b.per_row(|i, out| {
        let pairs = b.args[0]
            .row(i)
            .chunks_exact(c)
            .zip(b.args[1].row(i).chunks_exact(c));
        for (o, (x, y)) in out.chunks_exact_mut(c).zip(pairs) {
            f(x, y, o);
        }
    })
}
