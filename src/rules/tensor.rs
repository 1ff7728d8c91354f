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
//! | `softmax_vjp(y, v)` | v | `softmax_vjp(y, g)` | `softmax_vjp(y, t)` |
//! | `log_softmax_vjp(y, v)` | v | `log_softmax_jvp(y, g)` | `log_softmax_vjp(y, t)` |
//!
//! and so on for every entry of [`RULES`]. A number broadcast against a
//! tensor (`tensor_add(t, 1.0)`) receives the sum of its elements'
//! cotangents; a vector broadcast over a matrix's rows (a bias) the sum of
//! the rows' (`col_sum`). Functions that are piecewise constant (`argmax`,
//! `tensor_step`) or constant (`zeros_like`) have zero partials.
//! The fused helper products the rules write (`cross_entropy_grad`,
//! `softmax_vjp`, `log_softmax_vjp`, `log_softmax_jvp`) have rules of
//! their own, so derivatives of any order go through `softmax`,
//! `log_softmax`, `logsumexp` and `cross_entropy` (a training loop's
//! hypergradient differentiates its step's gradient once more).

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
    ("softmax_vjp", |c| {
        // y ⊙ g − row_scale(y, d), d = row_dot(y, g): in y, a tangent t
        // gives t ⊙ g − row_scale(t, d) − row_scale(y, row_dot(t, g)), and
        // a cotangent u goes back as u ⊙ g − row_scale(u, d) −
        // row_scale(g, row_dot(u, y)); in g it is softmax_vjp itself (the
        // Jacobian is symmetric).
        let (y, g) = (c.arg(0), c.arg(1));
        let d = f("row_dot", [y.clone(), g.clone()]);
        let jvp = f(
            "tensor_sub",
            [
                f("tensor_mul", [c.flow(), g.clone()]),
                f(
                    "tensor_add",
                    [
                        f("row_scale", [c.flow(), d.clone()]),
                        f(
                            "row_scale",
                            [y.clone(), f("row_dot", [c.flow(), g.clone()])],
                        ),
                    ],
                ),
            ],
        );
        let vjp = f(
            "tensor_sub",
            [
                f("tensor_mul", [c.flow(), g.clone()]),
                f(
                    "tensor_add",
                    [
                        f("row_scale", [c.flow(), d]),
                        f("row_scale", [g, f("row_dot", [c.flow(), y.clone()])]),
                    ],
                ),
            ],
        );
        let by_g = f("softmax_vjp", [y, c.flow()]);
        Ok(vec![linear(vjp, jvp), linear(by_g.clone(), by_g)])
    }),
    ("log_softmax_vjp", |c| {
        // g − row_scale(exp(y), S), S = the rows' sums of g: in y, t gives
        // −row_scale(exp(y) ⊙ t, S) and u goes back as −row_scale(u, S) ⊙
        // exp(y); in g the map is log_softmax_vjp, its transpose
        // log_softmax_jvp.
        let (y, g) = (c.arg(0), c.arg(1));
        let e = f("tensor_exp", [y.clone()]);
        let sums = f("row_dot", [g.clone(), f("fill_like", [g, num(1.0)])]);
        let jvp = f(
            "scale",
            [
                f(
                    "row_scale",
                    [f("tensor_mul", [e.clone(), c.flow()]), sums.clone()],
                ),
                num(-1.0),
            ],
        );
        let vjp = f(
            "scale",
            [
                f("tensor_mul", [f("row_scale", [c.flow(), sums]), e]),
                num(-1.0),
            ],
        );
        Ok(vec![
            linear(vjp, jvp),
            linear(
                f("log_softmax_jvp", [y.clone(), c.flow()]),
                f("log_softmax_vjp", [y, c.flow()]),
            ),
        ])
    }),
    ("log_softmax_jvp", |c| {
        // t − row_dot(exp(y), t) (each row's number taken from each of its
        // elements): in y, s gives −row_dot(exp(y) ⊙ s, t) so broadcast,
        // and u goes back as −row_scale(exp(y) ⊙ t, the rows' sums of u);
        // in t the map is log_softmax_jvp, its transpose log_softmax_vjp.
        let (y, t) = (c.arg(0), c.arg(1));
        let e = f("tensor_exp", [y.clone()]);
        let ones = f("fill_like", [t.clone(), num(1.0)]);
        let jvp = f(
            "scale",
            [
                f(
                    "row_scale",
                    [
                        ones.clone(),
                        f(
                            "row_dot",
                            [f("tensor_mul", [e.clone(), c.flow()]), t.clone()],
                        ),
                    ],
                ),
                num(-1.0),
            ],
        );
        let vjp = f(
            "scale",
            [
                f(
                    "row_scale",
                    [f("tensor_mul", [e, t]), f("row_dot", [c.flow(), ones])],
                ),
                num(-1.0),
            ],
        );
        Ok(vec![
            linear(vjp, jvp),
            linear(
                f("log_softmax_vjp", [y.clone(), c.flow()]),
                f("log_softmax_jvp", [y, c.flow()]),
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
