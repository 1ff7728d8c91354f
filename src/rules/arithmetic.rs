//! Rules for the arithmetic operators and `power`.
//!
//! | primitive | ∂/∂a | ∂/∂b |
//! |---|---|---|
//! | `a + b` | 1 | 1 |
//! | `a - b` | 1 | -1 |
//! | `a * b` | b | a |
//! | `a / b` | 1/b | -a/b² |
//! | `a % b` | 1 | -trunc(a/b) |
//! | `-a` | -1 | |
//! | `power(a, b)`, `pow` | b·a^(b-1) (0 where b = 0) | ln(a)·a^b (ln 1 where a = 0) |
//!
//! `power` follows JAX: with a constant exponent no `ln(a)` term appears, so
//! `x^c` at `x = 0` is finite for constant `c ≥ 1`. A negative power
//! `a^(b-1)` is written `1 / a^(1-b)` only at `a = 0`, where it is `±inf`
//! (DataFusion's `power` raises an error for zero to a negative power); an
//! underflowing power stays 0 in every order of derivative. In DataFusion's
//! default dialect `^` is bitwise XOR, which has no derivative rule.

use datafusion::error::Result;
use datafusion::functions::math::expr_fn::{ln, power, trunc};
use datafusion::logical_expr::{when, Expr};

use super::{num, Call, Partial, RuleEntry};

/// The arithmetic rules.
pub const RULES: &[RuleEntry] = &[
    ("+", plus),
    ("-", minus),
    ("*", times),
    ("/", divide),
    ("%", modulo),
    ("negate", negate),
    ("power", pow),
];

fn plus(_: &Call) -> Result<Vec<Partial>> {
    Ok(vec![Partial::Value(num(1.0)), Partial::Value(num(1.0))])
}

fn minus(_: &Call) -> Result<Vec<Partial>> {
    Ok(vec![Partial::Value(num(1.0)), Partial::Value(num(-1.0))])
}

fn times(c: &Call) -> Result<Vec<Partial>> {
    Ok(vec![Partial::Value(c.arg(1)), Partial::Value(c.arg(0))])
}

fn divide(c: &Call) -> Result<Vec<Partial>> {
    let (a, b) = (c.arg(0), c.arg(1));
    Ok(vec![
        Partial::Value(num(1.0) / b.clone()),
        Partial::Value(-(a / (b.clone() * b))),
    ])
}

fn modulo(c: &Call) -> Result<Vec<Partial>> {
    let (a, b) = (c.arg(0), c.arg(1));
    Ok(vec![
        Partial::Value(num(1.0)),
        Partial::Value(-trunc(vec![a / b])),
    ])
}

fn negate(_: &Call) -> Result<Vec<Partial>> {
    Ok(vec![Partial::Value(num(-1.0))])
}

fn pow(c: &Call) -> Result<Vec<Partial>> {
    let (a, b) = (c.arg(0), c.arg(1));
    let d_base = match c.literal(1) {
        Some(0.0) => Partial::Zero,
        Some(2.0) => Partial::Value(num(2.0) * a.clone()),
        Some(e) if e >= 1.0 => Partial::Value(num(e) * power(a.clone(), num(e - 1.0))),
        Some(e) => Partial::Value(below_one(&a, num(e))?),
        None => Partial::Value(
            when(b.clone().eq(num(0.0)), num(0.0))
                .when(b.clone().lt(num(1.0)), below_one(&a, b.clone())?)
                .otherwise(b.clone() * power(a.clone(), b - num(1.0)))?,
        ),
    };
    let d_exponent = match c.literal(0) {
        Some(base) if base > 0.0 => Partial::Value(num(base.ln()) * c.out()),
        _ => Partial::Value(ln(replace_zero(a)) * c.out()),
    };
    Ok(vec![d_base, d_exponent])
}

/// `b·a^(b-1)` for an exponent `b < 1`. At `a = 0` it is written
/// `b / a^(1-b)` (±inf; DataFusion's `power` raises an error for zero to a
/// negative power), elsewhere as it is: a large negative `b` then underflows
/// to 0 (as in JAX) instead of overflowing a denominator, whose own
/// derivative would be `inf · 0 = NaN`.
fn below_one(a: &Expr, b: Expr) -> Result<Expr> {
    when(
        a.clone().eq(num(0.0)),
        b.clone() / power(a.clone(), num(1.0) - b.clone()),
    )
    .otherwise(b.clone() * power(a.clone(), b - num(1.0)))
}

/// `a`, with 0 replaced by 1 (JAX's `_replace_zero`): `ln` of it is 0 at `a = 0`.
fn replace_zero(a: Expr) -> Expr {
    when(a.clone().eq(num(0.0)), num(1.0))
        .otherwise(a)
        .expect("a CASE with one branch is valid")
}
