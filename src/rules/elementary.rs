//! Rules for the elementary functions: exponentials, logarithms, roots,
//! trigonometric and hyperbolic functions, and the angle conversions.
//!
//! Domain edges follow IEEE arithmetic, not SQL errors: `sqrt'(0) = +inf`,
//! `ln'(0) = +inf`, `cbrt'(0) = +inf`, `asin'(±1) = +inf`.

use std::f64::consts::{LN_10, LN_2, PI};

use datafusion::error::Result;
use datafusion::functions::math::expr_fn::{cos, cosh, ln, power, sin, sinh};
use datafusion::logical_expr::Expr;

use super::{num, Call, Partial, RuleEntry};

/// The elementary-function rules.
pub const RULES: &[RuleEntry] = &[
    ("exp", |c| one(c.out())),
    ("ln", |c| one(num(1.0) / c.arg(0))),
    // log(x) is base 10 in DataFusion; log(b, x) = ln x / ln b.
    ("log", log),
    ("log2", |c| one(num(1.0) / (c.arg(0) * num(LN_2)))),
    ("log10", |c| one(num(1.0) / (c.arg(0) * num(LN_10)))),
    ("sqrt", |c| one(num(0.5) / c.out())),
    ("cbrt", |c| one(num(1.0) / (num(3.0) * c.out() * c.out()))),
    ("sin", |c| one(cos(c.arg(0)))),
    ("cos", |c| one(-sin(c.arg(0)))),
    ("tan", |c| one(num(1.0) + c.out() * c.out())),
    ("cot", |c| one(-(num(1.0) + c.out() * c.out()))),
    ("asin", |c| one(num(1.0) / root(num(1.0) - sq(c.arg(0))))),
    ("acos", |c| one(num(-1.0) / root(num(1.0) - sq(c.arg(0))))),
    ("atan", |c| one(num(1.0) / (num(1.0) + sq(c.arg(0))))),
    ("atan2", atan2),
    ("sinh", |c| one(cosh(c.arg(0)))),
    ("cosh", |c| one(sinh(c.arg(0)))),
    ("tanh", |c| one(num(1.0) - c.out() * c.out())),
    ("asinh", |c| one(num(1.0) / root(sq(c.arg(0)) + num(1.0)))),
    ("acosh", |c| {
        one(num(1.0) / root((c.arg(0) - num(1.0)) * (c.arg(0) + num(1.0))))
    }),
    ("atanh", |c| one(num(1.0) / (num(1.0) - sq(c.arg(0))))),
    ("degrees", |_| one(num(180.0 / PI))),
    ("radians", |_| one(num(PI / 180.0))),
];

fn one(d: Expr) -> Result<Vec<Partial>> {
    Ok(vec![Partial::Value(d)])
}

/// `√v` as `power(v, 0.5)`: NaN for negative `v` (outside the function's
/// domain, where `f` itself is NaN), where DataFusion's `sqrt` raises an error.
fn root(v: Expr) -> Expr {
    power(v, num(0.5))
}

fn sq(e: Expr) -> Expr {
    e.clone() * e
}

fn log(c: &Call) -> Result<Vec<Partial>> {
    if c.arity() == 1 {
        return one(num(1.0) / (c.arg(0) * num(LN_10)));
    }
    let (b, x) = (c.arg(0), c.arg(1));
    let d_base = match c.literal(0) {
        Some(_) => Partial::Zero,
        None => {
            let ln_b = ln(b.clone());
            Partial::Value(-(ln(x.clone()) / (b * ln_b.clone() * ln_b)))
        }
    };
    let ln_b = match c.literal(0) {
        Some(base) => num(base.ln()),
        None => ln(c.arg(0)),
    };
    Ok(vec![d_base, Partial::Value(num(1.0) / (x * ln_b))])
}

fn atan2(c: &Call) -> Result<Vec<Partial>> {
    let (y, x) = (c.arg(0), c.arg(1));
    let r2 = sq(x.clone()) + sq(y.clone());
    Ok(vec![
        Partial::Value(x / r2.clone()),
        Partial::Value(-y / r2),
    ])
}
