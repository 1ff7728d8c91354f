//! Rules for the tensor functions ([`crate::tensor`]): each partial is a
//! linear map given both ways, like JAX's jvp/transpose pairs — `vjp` maps
//! the output's cotangent `g` (= [`Call::flow`]) to the argument's, `jvp`
//! maps the argument's tangent `t` (= [`Call::flow`]) to the output's.
//!
//! | function | ∂ wrt | vjp (g) | jvp (t) |
//! |---|---|---|---|
//! | `matmul(a, b)` | a | `matmul_nt(g, b)` | `matmul(t, b)` |
//! | | b | `matmul_tn(a, g)` | `matmul(a, t)` |
//! | `matvec(m, v)` | m | `outer(g, v)` | `matvec(t, v)` |
//! | | v | `vecmat(g, m)` | `matvec(m, t)` |
//! | `dot(a, b)` | a | `scale(b, g)` | `dot(t, b)` |
//! | `softmax(z)` | z | `softmax_vjp(y, g)` | `softmax_vjp(y, t)` |
//! | `cross_entropy(z, l)` | z | `scale(cross_entropy_grad(z, l), g)` | `dot(cross_entropy_grad(z, l), t)` |
//! | `cross_entropy_grad(z, l)` | z | `scale(softmax_vjp(softmax(z), g), 1/rows)` | `scale(softmax_vjp(softmax(z), t), 1/rows)` |
//!
//! and so on for every entry of [`RULES`]. A number broadcast against a
//! tensor (`tensor_add(t, 1.0)`) receives the sum of its elements'
//! cotangents; a vector broadcast over a matrix's rows (a bias) the sum of
//! the rows' (`col_sum`). Functions that are piecewise constant (`argmax`,
//! `tensor_step`) or constant (`zeros_like`) have zero partials.
//! `cross_entropy_grad` has a rule, so second derivatives through
//! `cross_entropy` work (a training loop's hypergradient); the other fused
//! helper products (`softmax_vjp`, `log_softmax_vjp`) have none, so a
//! second derivative through `softmax` or `log_softmax`, a third through
//! `cross_entropy`, or a third through `logsumexp` (whose derivative is
//! `softmax`) is refused with a `non_differentiable` error rather than
//! computed wrongly.

use datafusion::error::Result;
use datafusion::logical_expr::Expr;

use super::{num, Call, Partial, RuleEntry};
use crate::tensor::{call, Shape};

/// The tensor-function rules.
pub const RULES: &[RuleEntry] = &[
    ("tensor_add", |c| {
        Ok(vec![sum_arg(c, 0, false), sum_arg(c, 1, false)])
    }),
    ("tensor_sub", |c| {
        Ok(vec![sum_arg(c, 0, false), sum_arg(c, 1, true)])
    }),
    ("tensor_mul", |c| {
        let each = |i: usize, other: Expr| {
            let g = f("tensor_mul", [c.flow(), other]);
            Partial::Linear {
                vjp: unbroadcast(c, i, g.clone()),
                jvp: g,
            }
        };
        Ok(vec![each(0, c.arg(1)), each(1, c.arg(0))])
    }),
    ("tensor_div", |c| {
        let g = f("tensor_div", [c.flow(), c.arg(1)]);
        let quotient = f("tensor_div", [c.out(), c.arg(1)]);
        let minus = f("scale", [f("tensor_mul", [c.flow(), quotient]), num(-1.0)]);
        Ok(vec![
            Partial::Linear {
                vjp: unbroadcast(c, 0, g.clone()),
                jvp: g,
            },
            Partial::Linear {
                vjp: unbroadcast(c, 1, minus.clone()),
                jvp: minus,
            },
        ])
    }),
    ("scale", |c| {
        let by_s = f("scale", [c.flow(), c.arg(1)]);
        let vjp_s = match c.shape(0) {
            Shape::Scalar => f("tensor_mul", [c.flow(), c.arg(0)]),
            _ => f("dot", [c.flow(), c.arg(0)]),
        };
        Ok(vec![
            linear(by_s.clone(), by_s),
            linear(vjp_s, f("scale", [c.arg(0), c.flow()])),
        ])
    }),
    ("tensor_exp", |c| diagonal(c, c.out())),
    ("tensor_ln", |c| {
        let g = f("tensor_div", [c.flow(), c.arg(0)]);
        Ok(vec![linear(g.clone(), g)])
    }),
    ("tensor_sqrt", |c| {
        let g = f("tensor_div", [f("scale", [c.flow(), num(0.5)]), c.out()]);
        Ok(vec![linear(g.clone(), g)])
    }),
    ("tensor_tanh", |c| {
        let y2 = f("tensor_mul", [c.out(), c.out()]);
        diagonal(c, f("tensor_sub", [num(1.0), y2]))
    }),
    ("sigmoid", |c| {
        let one_minus = f("tensor_sub", [num(1.0), c.out()]);
        diagonal(c, f("tensor_mul", [c.out(), one_minus]))
    }),
    ("relu", |c| diagonal(c, f("tensor_step", [c.arg(0)]))),
    ("tensor_step", zero),
    ("argmax", zero),
    ("zeros_like", zero),
    ("random_tensor", zero),
    ("one_hot", zero),
    ("fill_like", |c| {
        Ok(vec![
            Partial::Zero,
            linear(
                f("tensor_total", [c.flow()]),
                f("fill_like", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("tensor_total", |c| {
        Ok(vec![linear(
            f("fill_like", [c.arg(0), c.flow()]),
            f("tensor_total", [c.flow()]),
        )])
    }),
    ("tensor_mean", |c| {
        let n = num(c.shape(0).size() as f64);
        Ok(vec![linear(
            f("fill_like", [c.arg(0), c.flow() / n]),
            f("tensor_mean", [c.flow()]),
        )])
    }),
    ("col_sum", |c| {
        Ok(vec![linear(
            f("tensor_add", [f("zeros_like", [c.arg(0)]), c.flow()]),
            f("col_sum", [c.flow()]),
        )])
    }),
    ("norm", |c| {
        Ok(vec![linear(
            f("scale", [c.arg(0), c.flow() / c.out()]),
            f("dot", [c.arg(0), c.flow()]) / c.out(),
        )])
    }),
    ("dot", |c| {
        Ok(vec![
            linear(
                f("scale", [c.arg(1), c.flow()]),
                f("dot", [c.flow(), c.arg(1)]),
            ),
            linear(
                f("scale", [c.arg(0), c.flow()]),
                f("dot", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("matvec", |c| {
        Ok(vec![
            linear(
                f("outer", [c.flow(), c.arg(1)]),
                f("matvec", [c.flow(), c.arg(1)]),
            ),
            linear(
                f("vecmat", [c.flow(), c.arg(0)]),
                f("matvec", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("vecmat", |c| {
        Ok(vec![
            linear(
                f("matvec", [c.arg(1), c.flow()]),
                f("vecmat", [c.flow(), c.arg(1)]),
            ),
            linear(
                f("outer", [c.arg(0), c.flow()]),
                f("vecmat", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("matmul", |c| {
        Ok(vec![
            linear(
                f("matmul_nt", [c.flow(), c.arg(1)]),
                f("matmul", [c.flow(), c.arg(1)]),
            ),
            linear(
                f("matmul_tn", [c.arg(0), c.flow()]),
                f("matmul", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("matmul_tn", |c| {
        Ok(vec![
            linear(
                f("matmul_nt", [c.arg(1), c.flow()]),
                f("matmul_tn", [c.flow(), c.arg(1)]),
            ),
            linear(
                f("matmul", [c.arg(0), c.flow()]),
                f("matmul_tn", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("matmul_nt", |c| {
        Ok(vec![
            linear(
                f("matmul", [c.flow(), c.arg(1)]),
                f("matmul_nt", [c.flow(), c.arg(1)]),
            ),
            linear(
                f("matmul_tn", [c.flow(), c.arg(0)]),
                f("matmul_nt", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("transpose", |c| {
        let t = f("transpose", [c.flow()]);
        Ok(vec![linear(t.clone(), t)])
    }),
    ("outer", |c| {
        Ok(vec![
            linear(
                f("matvec", [c.flow(), c.arg(1)]),
                f("outer", [c.flow(), c.arg(1)]),
            ),
            linear(
                f("vecmat", [c.arg(0), c.flow()]),
                f("outer", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("reshape", |c| {
        let back = match c.shape(0) {
            Shape::Vector(n) => vec![c.flow(), num(n as f64)],
            Shape::Matrix(r, k) => vec![c.flow(), num(r as f64), num(k as f64)],
            Shape::Scalar => unreachable!("reshape takes a tensor"),
        };
        let mut forward = vec![c.flow()];
        forward.extend((1..c.arity()).map(|i| c.arg(i)));
        let mut partials = vec![linear(call("reshape", back), call("reshape", forward))];
        partials.extend((1..c.arity()).map(|_| Partial::Zero));
        Ok(partials)
    }),
    ("softmax", |c| {
        let g = f("softmax_vjp", [c.out(), c.flow()]);
        Ok(vec![linear(g.clone(), g)])
    }),
    ("log_softmax", |c| {
        Ok(vec![linear(
            f("log_softmax_vjp", [c.out(), c.flow()]),
            f("log_softmax_jvp", [c.out(), c.flow()]),
        )])
    }),
    ("logsumexp", |c| {
        let p = f("softmax", [c.arg(0)]);
        Ok(vec![linear(
            f("row_scale", [p.clone(), c.flow()]),
            f("row_dot", [p, c.flow()]),
        )])
    }),
    ("row_dot", |c| {
        Ok(vec![
            linear(
                f("row_scale", [c.arg(1), c.flow()]),
                f("row_dot", [c.flow(), c.arg(1)]),
            ),
            linear(
                f("row_scale", [c.arg(0), c.flow()]),
                f("row_dot", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("row_scale", |c| {
        let by_s = f("row_scale", [c.flow(), c.arg(1)]);
        Ok(vec![
            linear(by_s.clone(), by_s),
            linear(
                f("row_dot", [c.flow(), c.arg(0)]),
                f("row_scale", [c.arg(0), c.flow()]),
            ),
        ])
    }),
    ("cross_entropy", |c| {
        let d = f("cross_entropy_grad", [c.arg(0), c.arg(1)]);
        Ok(vec![
            linear(f("scale", [d.clone(), c.flow()]), f("dot", [d, c.flow()])),
            // Class labels are piecewise constant.
            Partial::Zero,
        ])
    }),
    ("cross_entropy_grad", |c| {
        // (softmax(z) − one_hot(l)) / rows: the softmax Jacobian of each
        // row (symmetric, so vjp and jvp are one map), over the rows.
        let rows = match c.shape(0) {
            Shape::Matrix(r, _) => r,
            _ => 1,
        };
        let p = f("softmax", [c.arg(0)]);
        let j = f(
            "scale",
            [f("softmax_vjp", [p, c.flow()]), num(1.0 / rows as f64)],
        );
        Ok(vec![linear(j.clone(), j), Partial::Zero])
    }),
];

/// A call of the tensor function `name`.
fn f<const N: usize>(name: &str, args: [Expr; N]) -> Expr {
    call(name, args.to_vec())
}

fn linear(vjp: Expr, jvp: Expr) -> Partial {
    Partial::Linear { vjp, jvp }
}

fn zero(c: &Call) -> Result<Vec<Partial>> {
    Ok(vec![Partial::Zero; c.arity()])
}

/// An elementwise function with derivative `d`: flows are multiplied by it
/// elementwise in both directions.
fn diagonal(c: &Call, d: Expr) -> Result<Vec<Partial>> {
    let g = f("tensor_mul", [c.flow(), d]);
    Ok(vec![linear(g.clone(), g)])
}

/// The cotangent `g` of a broadcast operation's output as argument `i`'s:
/// summed over the elements when the argument is a number and the output a
/// tensor, over the rows when it is a vector and the output a matrix.
fn unbroadcast(c: &Call, i: usize, g: Expr) -> Expr {
    match (c.shape(i), c.out_shape()) {
        (Shape::Scalar, out) if out.is_tensor() => f("tensor_total", [g]),
        (Shape::Vector(_), Shape::Matrix(..)) => f("col_sum", [g]),
        _ => g,
    }
}

/// Argument `i` of `tensor_add`/`tensor_sub` (`negated` for the subtrahend).
fn sum_arg(c: &Call, i: usize, negated: bool) -> Partial {
    let signed = |e: Expr| {
        if negated {
            f("scale", [e, num(-1.0)])
        } else {
            e
        }
    };
    let jvp = match (c.shape(i), c.out_shape()) {
        (Shape::Scalar, out) if out.is_tensor() => f("fill_like", [c.out(), c.flow()]),
        (Shape::Vector(_), Shape::Matrix(..)) => {
            f("tensor_add", [f("zeros_like", [c.out()]), c.flow()])
        }
        _ => c.flow(),
    };
    Partial::Linear {
        vjp: unbroadcast(c, i, signed(c.flow())),
        jvp: signed(jvp),
    }
}
