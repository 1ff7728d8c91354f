//! Elementwise tensor functions: arithmetic between tensors of one shape, a
//! tensor and a number, or a matrix and a vector added to each of its rows
//! (broadcast), `scale`, the unary maps, and `fill_like`/`zeros_like`.

use datafusion::common::ScalarValue;
use datafusion::error::Result;

use super::function::{mismatch, Batch, Spec};
use super::kernels;
use super::shape::Shape;

/// The elementwise functions.
pub static SPECS: &[Spec] = &[
    Spec {
        name: "tensor_add",
        description: "Elementwise a + b of two tensors of one shape, a tensor and a number, or a matrix and a vector of its row length (each row).",
        syntax: "tensor_add(a, b)",
        example: "SELECT tensor_add(tensor([1.0, 2.0], 2), 10.0); -- [11.0, 12.0]",
        arity: 2..=2,
        shape: broadcast_shape::<0>,
        eval: |b| binary(b, kernels::add, |x, y| x + y),
    },
    Spec {
        name: "tensor_sub",
        description: "Elementwise a - b of two tensors of one shape, a tensor and a number, or a matrix and a vector of its row length (each row).",
        syntax: "tensor_sub(a, b)",
        example: "SELECT tensor_sub(tensor([1.0, 2.0], 2), tensor([0.5, 0.5], 2)); -- [0.5, 1.5]",
        arity: 2..=2,
        shape: broadcast_shape::<1>,
        eval: |b| binary(b, kernels::sub, |x, y| x - y),
    },
    Spec {
        name: "tensor_mul",
        description: "Elementwise (Hadamard) product of two tensors of one shape, a tensor and a number, or a matrix and a vector of its row length (each row).",
        syntax: "tensor_mul(a, b)",
        example: "SELECT tensor_mul(tensor([1.0, 2.0], 2), tensor([3.0, 4.0], 2)); -- [3.0, 8.0]",
        arity: 2..=2,
        shape: broadcast_shape::<2>,
        eval: |b| binary(b, kernels::mul, |x, y| x * y),
    },
    Spec {
        name: "tensor_div",
        description: "Elementwise a / b of two tensors of one shape, a tensor and a number, or a matrix and a vector of its row length (each row) (IEEE: x/0 is ±inf or NaN).",
        syntax: "tensor_div(a, b)",
        example: "SELECT tensor_div(tensor([1.0, 2.0], 2), 4.0); -- [0.25, 0.5]",
        arity: 2..=2,
        shape: broadcast_shape::<3>,
        eval: |b| binary(b, kernels::div, |x, y| x / y),
    },
    Spec {
        name: "scale",
        description: "A tensor multiplied by a number.",
        syntax: "scale(t, s)",
        example: "SELECT scale(tensor([1.0, 2.0], 2), 3.0); -- [3.0, 6.0]",
        arity: 2..=2,
        shape: |s, _| match s {
            [t, Shape::Scalar] => Ok(*t),
            _ => mismatch("scale", format!("scale(t, s) needs a number s, got {}", s[1])),
        },
        eval: |b| binary(b, kernels::mul, |x, y| x * y),
    },
    Spec {
        name: "tensor_exp",
        description: "Elementwise e^x.",
        syntax: "tensor_exp(t)",
        example: "SELECT tensor_exp(tensor([0.0, 1.0], 2)); -- [1.0, 2.718281828459045]",
        arity: 1..=1,
        shape: same_shape,
        eval: |b| Ok(unary(b, |a, out| kernels::map(a, out, f64::exp))),
    },
    Spec {
        name: "tensor_ln",
        description: "Elementwise natural logarithm (IEEE: ln 0 = -inf, ln of a negative number is NaN).",
        syntax: "tensor_ln(t)",
        example: "SELECT tensor_ln(tensor([1.0, 1.0], 2)); -- [0.0, 0.0]",
        arity: 1..=1,
        shape: same_shape,
        eval: |b| Ok(unary(b, |a, out| kernels::map(a, out, f64::ln))),
    },
    Spec {
        name: "tensor_sqrt",
        description: "Elementwise square root (IEEE: NaN for negative numbers).",
        syntax: "tensor_sqrt(t)",
        example: "SELECT tensor_sqrt(tensor([4.0, 9.0], 2)); -- [2.0, 3.0]",
        arity: 1..=1,
        shape: same_shape,
        eval: |b| Ok(unary(b, |a, out| kernels::map(a, out, f64::sqrt))),
    },
    Spec {
        name: "tensor_tanh",
        description: "Elementwise hyperbolic tangent.",
        syntax: "tensor_tanh(t)",
        example: "SELECT tensor_tanh(tensor([0.0, 0.0], 2)); -- [0.0, 0.0]",
        arity: 1..=1,
        shape: same_shape,
        eval: |b| Ok(unary(b, |a, out| kernels::map(a, out, f64::tanh))),
    },
    Spec {
        name: "sigmoid",
        description: "Elementwise logistic function 1 / (1 + e^-x).",
        syntax: "sigmoid(t)",
        example: "SELECT sigmoid(tensor([0.0, 0.0], 2)); -- [0.5, 0.5]",
        arity: 1..=1,
        shape: same_shape,
        eval: |b| Ok(unary(b, |a, out| kernels::map(a, out, sigmoid))),
    },
    Spec {
        name: "relu",
        description: "Elementwise max(x, 0) (NaN stays NaN). Its derivative at 0 is 0, as in JAX.",
        syntax: "relu(t)",
        example: "SELECT relu(tensor([-1.0, 2.0], 2)); -- [0.0, 2.0]",
        arity: 1..=1,
        shape: same_shape,
        eval: |b| Ok(unary(b, kernels::relu)),
    },
    Spec {
        name: "tensor_step",
        description: "Elementwise Heaviside step: 1 where x > 0, else 0 (NaN stays NaN); the derivative of relu.",
        syntax: "tensor_step(t)",
        example: "SELECT tensor_step(tensor([-1.0, 2.0], 2)); -- [0.0, 1.0]",
        arity: 1..=1,
        shape: same_shape,
        eval: |b| Ok(unary(b, |a, out| kernels::map(a, out, step))),
    },
    Spec {
        name: "fill_like",
        description: "A tensor of t's shape with every element s.",
        syntax: "fill_like(t, s)",
        example: "SELECT fill_like(tensor([1.0, 2.0], 2), 7.0); -- [7.0, 7.0]",
        arity: 2..=2,
        shape: |s, _| match s {
            [t, Shape::Scalar] => Ok(*t),
            _ => mismatch("fill_like", format!("fill_like(t, s) needs a number s, got {}", s[1])),
        },
        eval: |b| Ok(b.per_row(|i, out| out.fill(b.args[1].number(i)))),
    },
    Spec {
        name: "zeros_like",
        description: "A tensor of t's shape filled with zeros.",
        syntax: "zeros_like(t)",
        example: "SELECT zeros_like(tensor([1.0, 2.0], 2)); -- [0.0, 0.0]",
        arity: 1..=1,
        shape: same_shape,
        eval: |b| Ok(vec![0.0; b.rows * b.out.size()]),
    },
];

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn step(x: f64) -> f64 {
    if x.is_nan() {
        x
    } else if x > 0.0 {
        1.0
    } else {
        0.0
    }
}

/// The shape of `f(a)` for an elementwise `f`.
fn same_shape(s: &[Shape], _: &[Option<&ScalarValue>]) -> Result<Shape> {
    Ok(s[0])
}

/// The shape of an elementwise binary operation (operator index `OP` names it).
fn broadcast_shape<const OP: usize>(s: &[Shape], _: &[Option<&ScalarValue>]) -> Result<Shape> {
    const NAMES: [&str; 4] = ["tensor_add", "tensor_sub", "tensor_mul", "tensor_div"];
    broadcast(NAMES[OP], s[0], s[1])
}

/// The common shape of two elementwise operands: equal shapes, a number with
/// anything, or a matrix with a vector of its row length (applied to each
/// row, like NumPy's broadcasting of a bias).
pub fn broadcast(function: &str, a: Shape, b: Shape) -> Result<Shape> {
    match (a, b) {
        (a, b) if a == b => Ok(a),
        (Shape::Scalar, t) | (t, Shape::Scalar) => Ok(t),
        (m @ Shape::Matrix(_, c), Shape::Vector(n))
        | (Shape::Vector(n), m @ Shape::Matrix(_, c))
            if c == n =>
        {
            Ok(m)
        }
        (a, b) => mismatch(function, format!("cannot combine {a} and {b} elementwise")),
    }
}

/// An elementwise map over a batch: one call over the whole column when the
/// argument is one, else per row.
fn unary(b: &Batch, f: impl Fn(&[f64], &mut [f64])) -> Vec<f64> {
    match b.args[0].column() {
        Some(all) => {
            let mut out = vec![0.0; all.len()];
            f(all, &mut out);
            out
        }
        None => b.per_row(|i, out| f(b.args[0].row(i), out)),
    }
}

/// An elementwise binary operation over a batch: one kernel call over whole
/// columns of one shape, per row otherwise (a number operand broadcast).
fn binary(
    b: &Batch,
    same: fn(&[f64], &[f64], &mut [f64]),
    op: impl Fn(f64, f64) -> f64,
) -> Result<Vec<f64>> {
    let (x, y) = (&b.args[0], &b.args[1]);
    if x.shape == y.shape {
        if let (Some(xs), Some(ys)) = (x.column(), y.column()) {
            let mut out = vec![0.0; xs.len()];
            same(xs, ys, &mut out);
            return Ok(out);
        }
        return Ok(b.per_row(|i, out| same(x.row(i), y.row(i), out)));
    }
    Ok(match (x.shape, y.shape) {
        (Shape::Matrix(_, c), Shape::Vector(_)) => b.per_row(|i, out| {
            let v = y.row(i);
            for (o, m) in out.chunks_exact_mut(c).zip(x.row(i).chunks_exact(c)) {
                for ((o, &p), &q) in o.iter_mut().zip(m).zip(v) {
                    *o = op(p, q);
                }
            }
        }),
        (Shape::Vector(_), Shape::Matrix(_, c)) => b.per_row(|i, out| {
            let v = x.row(i);
            for (o, m) in out.chunks_exact_mut(c).zip(y.row(i).chunks_exact(c)) {
                for ((o, &p), &q) in o.iter_mut().zip(v).zip(m) {
                    *o = op(p, q);
                }
            }
        }),
        (_, Shape::Scalar) => b.per_row(|i, out| {
            let s = y.number(i);
            for (o, &v) in out.iter_mut().zip(x.row(i)) {
                *o = op(v, s);
            }
        }),
        _ => b.per_row(|i, out| {
            let s = x.number(i);
            for (o, &v) in out.iter_mut().zip(y.row(i)) {
                *o = op(s, v);
            }
        }),
    })
}
