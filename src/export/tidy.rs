//! Fixes to printed SQL that the unparser gets wrong for real engines.
//!
//! - `-(-x)` is printed `--x`, which SQL reads as a comment: nested
//!   negations (and negated negative numbers) are parenthesized.
//! - functions the engine names differently are renamed
//!   ([`SqlDialect::rename`]: `signum` → `sign`, `var` → `var_samp`,
//!   SQLite's `length` for `character_length`, …).
//! - floats are printed in full positional notation (`1e-300` as 300
//!   digits): they are written as the shortest text that reads back as the
//!   same double, with an exponent where that is shorter. DuckDB reads a
//!   decimal point without an exponent as a DECIMAL, so its floats always
//!   carry one (`0.5e0`).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, Expr, Ident, ObjectNamePart, UnaryOperator, Value, ValueWithSpan,
    VisitMut,
};

use super::SqlDialect;

/// `node` (a statement or an expression) with the fixes above applied.
pub(crate) fn tidy<N: VisitMut>(node: &mut N, dialect: SqlDialect) {
    let _: ControlFlow<()> = visit_expressions_mut(node, |e| {
        match e {
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr,
            } if starts_with_minus(expr) => {
                let inner = std::mem::replace(expr.as_mut(), Expr::value(Value::Null));
                **expr = Expr::Nested(Box::new(inner));
            }
            Expr::Value(ValueWithSpan {
                value: Value::Number(text, _),
                ..
            }) => {
                if let Some(float) = float_text(text, dialect) {
                    *text = float;
                }
            }
            Expr::Function(f) => {
                if let [ObjectNamePart::Identifier(name)] = f.name.0.as_mut_slice() {
                    if let Some(new) = name
                        .quote_style
                        .is_none()
                        .then(|| dialect.rename(&name.value))
                        .flatten()
                    {
                        *name = Ident::new(new);
                    }
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    });
}

fn starts_with_minus(e: &Expr) -> bool {
    match e {
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            ..
        } => true,
        Expr::Value(ValueWithSpan {
            value: Value::Number(text, _),
            ..
        }) => text.starts_with('-'),
        _ => false,
    }
}

/// The engine's spelling of the float literal `text`, or `None` for an integer.
// pub for the tests in tests/unit/export_tidy.rs
#[doc(hidden)]
pub fn float_text(text: &str, dialect: SqlDialect) -> Option<String> {
    if !text.contains(['.', 'e', 'E']) {
        return None;
    }
    let v: f64 = text.parse().ok()?;
    let mut out = format!("{v:?}");
    if dialect == SqlDialect::DuckDb && !out.contains('e') {
        out.push_str("e0");
    }
    Some(out)
}
