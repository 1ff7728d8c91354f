//! Rules for piecewise functions: selections (`CASE`, `coalesce`/`nvl`, `nvl2`, `nullif`,
//! `nanvl`, `greatest`, `least`), `abs`, the piecewise-constant functions, and
//! `CAST`.
//!
//! Conventions (the same as JAX's): `abs'(0) = 1`; `signum' = 0`;
//! `floor`, `ceil`, `round`, `trunc` have derivative 0; at a tie of
//! `greatest`/`least` each tied argument gets an equal share (0.5 for two).
//! `CASE` conditions are not differentiated: the derivative is that of the
//! branch taken. A `CAST` to a float type is the identity; casts to integer or
//! decimal types are piecewise constant and never reach these rules (the engine
//! treats them as constants, derivative 0).

use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;

use crate::error::GradError;
use datafusion::functions::math::expr_fn::isnan;
use datafusion::logical_expr::{when, Case, Expr};

use super::{null, num, Call, Partial, RuleEntry};
use crate::tensor::Shape;

/// The piecewise rules.
pub const RULES: &[RuleEntry] = &[
    ("abs", abs),
    ("signum", zero),
    ("floor", zero),
    ("ceil", zero),
    ("round", zero),
    ("trunc", zero),
    ("greatest", extremum),
    ("least", extremum),
    ("case", case),
    ("coalesce", coalesce),
    ("nvl", coalesce),
    ("nvl2", nvl2),
    ("nullif", |_| {
        Ok(vec![Partial::Value(num(1.0)), Partial::Zero])
    }),
    ("nanvl", nanvl),
    ("cast", cast),
    ("try_cast", cast),
];

fn zero(c: &Call) -> Result<Vec<Partial>> {
    Ok(vec![Partial::Zero; c.arity()])
}

fn abs(c: &Call) -> Result<Vec<Partial>> {
    Ok(vec![Partial::Value(
        when(c.arg(0).lt(num(0.0)), num(-1.0)).otherwise(num(1.0))?,
    )])
}

/// `greatest`/`least`: 1/k for each of the k arguments equal to the output.
/// With two arguments (the common case) the tie test compares them directly,
/// which keeps the emitted expression small.
fn extremum(c: &Call) -> Result<Vec<Partial>> {
    if c.arity() == 2 {
        let tie = c.arg(0).eq(c.arg(1));
        return (0..2)
            .map(|i| {
                Ok(Partial::Selected(
                    when(tie.clone(), num(0.5))
                        .when(c.arg(i).eq(c.out()), num(1.0))
                        .end()?,
                ))
            })
            .collect();
    }
    let hits = (0..c.arity())
        .map(|j| when(c.arg(j).eq(c.out()), num(1.0)).otherwise(num(0.0)))
        .collect::<Result<Vec<_>>>()?;
    let count = hits
        .into_iter()
        .reduce(|a, b| a + b)
        .expect("greatest/least have at least one argument");
    (0..c.arity())
        .map(|i| {
            Ok(Partial::Selected(
                when(c.arg(i).eq(c.out()), num(1.0) / count.clone()).end()?,
            ))
        })
        .collect()
}

/// `CASE`: the branch taken gets 1, the others are not selected; conditions
/// (and a simple CASE's operand) get no derivative.
fn case(c: &Call) -> Result<Vec<Partial>> {
    let Expr::Case(shape) = c.out() else {
        return Ok(vec![Partial::Zero; c.arity()]);
    };
    let branches = shape.when_then_expr.len() + usize::from(shape.else_expr.is_some());
    let indicator = |taken: usize| {
        let when_then = shape
            .when_then_expr
            .iter()
            .enumerate()
            .map(|(k, (w, _))| {
                let value = if k == taken { num(1.0) } else { null() };
                (w.clone(), Box::new(value))
            })
            .collect();
        let otherwise = shape.else_expr.as_ref().map(|_| {
            Box::new(if taken == shape.when_then_expr.len() {
                num(1.0)
            } else {
                null()
            })
        });
        Expr::Case(Case::new(shape.expr.clone(), when_then, otherwise))
    };
    let mut partials = Vec::with_capacity(c.arity());
    if shape.expr.is_some() {
        partials.push(Partial::Zero);
    }
    for k in 0..shape.when_then_expr.len() {
        partials.push(Partial::Zero);
        partials.push(Partial::Selected(indicator(k)));
    }
    if shape.else_expr.is_some() {
        partials.push(Partial::Selected(indicator(branches - 1)));
    }
    Ok(partials)
}

/// `coalesce`: the first non-NULL argument is selected.
fn coalesce(c: &Call) -> Result<Vec<Partial>> {
    (0..c.arity())
        .map(|i| {
            let mut chain = when(
                c.arg(0).is_not_null(),
                if i == 0 { num(1.0) } else { null() },
            );
            for j in 1..=i {
                chain = chain.when(
                    c.arg(j).is_not_null(),
                    if j == i { num(1.0) } else { null() },
                );
            }
            Ok(Partial::Selected(chain.end()?))
        })
        .collect()
}

/// `nvl2(a, b, c)`: `b` where `a` is not NULL, else `c` (`a` only selects).
fn nvl2(c: &Call) -> Result<Vec<Partial>> {
    Ok(vec![
        Partial::Zero,
        Partial::Selected(when(c.arg(0).is_not_null(), num(1.0)).end()?),
        Partial::Selected(when(c.arg(0).is_null(), num(1.0)).end()?),
    ])
}

/// `nanvl(a, b)`: `b` where `a` is NaN, else `a`.
fn nanvl(c: &Call) -> Result<Vec<Partial>> {
    let a_is_nan = isnan(c.arg(0));
    Ok(vec![
        Partial::Selected(when(a_is_nan.clone(), null()).otherwise(num(1.0))?),
        Partial::Selected(when(a_is_nan, num(1.0)).end()?),
    ])
}

/// A cast to a float type (or of a tensor to a Float64 tensor) is the
/// identity; to any other (non piecewise constant) type, such as a string,
/// it cannot be differentiated.
fn cast(c: &Call) -> Result<Vec<Partial>> {
    let target = match c.out() {
        Expr::Cast(cast) => cast.field.data_type().clone(),
        Expr::TryCast(cast) => cast.field.data_type().clone(),
        _ => DataType::Float64,
    };
    if Shape::is_tensor_type(&target) {
        // A tensor cast to the canonical Float64 tensor type: the identity.
        return Ok(vec![Partial::Linear {
            vjp: c.flow(),
            jvp: c.flow(),
        }]);
    }
    if !matches!(
        target,
        DataType::Float16 | DataType::Float32 | DataType::Float64
    ) {
        return Err(GradError::non_differentiable(
            &format!("CAST(... AS {target})"),
            "only casts to float types carry a derivative",
        )
        .into());
    }
    Ok(vec![Partial::Value(num(1.0))])
}
