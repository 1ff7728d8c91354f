//! Unit tests of `src/engine/sign.rs`: what is known of a number's sign.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::DFSchema;
use datafusion::functions::math::expr_fn::{abs, exp, power, sin, sqrt};
use datafusion::logical_expr::{col, lit, when, Expr};
use datafusion_grad::engine::sign::Sign;
use datafusion_grad::engine::Workspace;
use datafusion_grad::rules::Rules;

fn schema() -> DFSchema {
    let fields = vec![
        Field::new("x", DataType::Float64, true),
        Field::new("y", DataType::Float64, true),
        Field::new("n", DataType::Int64, true),
    ];
    DFSchema::try_from(Arc::new(Schema::new(fields))).unwrap()
}

fn sign_of(e: Expr) -> Sign {
    let (schema, rules) = (schema(), Rules::builtin());
    let mut ws = Workspace::new(&schema, &rules);
    let id = ws.intern(&e).unwrap();
    ws.sign(id)
}

#[test]
fn signs_follow_the_expression() {
    let (x, y) = (col("x"), col("y"));
    let square = x.clone() * x.clone();
    assert_eq!(sign_of(lit(1.2) + square.clone()), Sign::Positive);
    assert_eq!(sign_of(square.clone()), Sign::NonNegative);
    assert_eq!(sign_of(sqrt(square.clone())), Sign::NonNegative);
    assert_eq!(
        sign_of(power(lit(1.2) + square.clone(), y.clone())),
        Sign::NonNegative
    );
    assert_eq!(
        sign_of(abs(x.clone()) / (lit(1.0) + exp(y.clone()))),
        Sign::NonNegative
    );
    let case = when(x.clone().gt(lit(0.0)), lit(2.0)).otherwise(lit(1.0) + square.clone());
    assert_eq!(sign_of(case.unwrap()), Sign::Positive);
    // what may be negative is unknown
    assert_eq!(sign_of(x.clone() * y.clone()), Sign::Unknown);
    assert_eq!(sign_of(lit(1.2) - square.clone()), Sign::Unknown);
    assert_eq!(sign_of(sin(x.clone())), Sign::Unknown);
    assert_eq!(sign_of(-(lit(1.2) + square)), Sign::Unknown);
    // a product of positive numbers may underflow to 0
    assert_eq!(sign_of(exp(x.clone()) * exp(y.clone())), Sign::NonNegative);
    // a quotient by a non-negative number may be -inf (over -0.0)
    assert_eq!(sign_of(lit(1.0) / abs(x)), Sign::Unknown);
    // integer arithmetic wraps around
    assert_eq!(sign_of(lit(1) + col("n") * col("n")), Sign::Unknown);
}
