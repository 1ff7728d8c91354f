//! How the engine classifies an expression node: which rule differentiates it,
//! whether derivatives flow through it at all, and through which arguments.

use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, Operator, Volatility};

use super::graph::is_arithmetic;
use crate::error::{fail, ErrorKind, GradError};

/// The rule-table key of a node that derivatives flow through.
pub fn rule_key(shell: &Expr) -> Result<String> {
    match shell {
        Expr::ScalarFunction(f) => Ok(f.func.name().to_string()),
        Expr::BinaryExpr(b) => Ok(b.op.to_string()),
        Expr::Negative(_) => Ok("negate".into()),
        Expr::Cast(_) => Ok("cast".into()),
        Expr::TryCast(_) => Ok("try_cast".into()),
        Expr::Case(_) => Ok("case".into()),
        Expr::AggregateFunction(a) => fail(
            ErrorKind::NeedsPlanContext,
            format!(
                "the aggregate `{}` depends on the variable; differentiate inside it \
                 (e.g. avg(grad(f, x))) or through it with the plan rule",
                a.func.name()
            ),
        ),
        Expr::WindowFunction(_) => fail(
            ErrorKind::NeedsPlanContext,
            "a window function depends on the variable; put the marker inside its argument",
        ),
        other => Err(GradError::non_differentiable(
            other.variant_name(),
            "this kind of expression has no derivative rule",
        )
        .into()),
    }
}

/// Whether derivatives stop at this node: its value is boolean, or piecewise
/// constant (a cast to an integer, decimal or boolean type), or a constant
/// leaf. Every other node with a variable below it needs a rule (a cast to a
/// string, `||`, bitwise operators have none and are refused).
pub fn blocks(shell: &Expr) -> bool {
    match shell {
        Expr::BinaryExpr(b) => {
            !is_arithmetic(b.op)
                && (b.op.supports_propagation()
                    || b.op.is_logic_operator()
                    || matches!(
                        b.op,
                        Operator::LikeMatch
                            | Operator::ILikeMatch
                            | Operator::NotLikeMatch
                            | Operator::NotILikeMatch
                    ))
        }
        Expr::Cast(c) => is_step(c.field.data_type()),
        Expr::TryCast(c) => is_step(c.field.data_type()),
        Expr::ScalarFunction(_)
        | Expr::Negative(_)
        | Expr::Case(_)
        | Expr::Alias(_)
        | Expr::AggregateFunction(_)
        | Expr::WindowFunction(_) => false,
        _ => true,
    }
}

/// Whether argument `i` of this node is differentiated (`CASE` conditions and
/// a simple `CASE`'s operand are not).
pub fn differentiated(shell: &Expr, i: usize) -> bool {
    match shell {
        Expr::Case(case) => {
            let start = usize::from(case.expr.is_some());
            i >= start && ((i - start) % 2 == 1 || i - start == 2 * case.when_then_expr.len())
        }
        _ => true,
    }
}

/// Refuses volatile functions: their derivative would be evaluated with
/// different random values than `f`.
pub fn check_volatility(shell: &Expr) -> Result<()> {
    if let Expr::ScalarFunction(f) = shell {
        if f.func.signature().volatility == Volatility::Volatile {
            return Err(GradError::non_differentiable(
                f.func.name(),
                "it is volatile, so a derivative cannot see the values f saw",
            )
            .into());
        }
    }
    Ok(())
}

/// Whether a cast to `t` is piecewise constant (integer, decimal, boolean).
fn is_step(t: &DataType) -> bool {
    t.is_integer()
        || matches!(
            t,
            DataType::Boolean
                | DataType::Decimal32(..)
                | DataType::Decimal64(..)
                | DataType::Decimal128(..)
                | DataType::Decimal256(..)
        )
}

/// Whether `t` is a floating-point type.
pub fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

/// Functions that never raise an error, whatever their (numeric) arguments:
/// outside their domain they return NaN or ±inf. (`sqrt` and `power` are not
/// among them: DataFusion raises errors for `sqrt` of a negative number and
/// for zero to a negative power.)
pub const SAFE_FUNCTIONS: &[&str] = &[
    "exp", "ln", "log", "log2", "log10", "cbrt", "sin", "cos", "tan", "cot", "asin", "acos",
    "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "degrees", "radians",
    "abs", "signum", "floor", "ceil", "round", "trunc", "greatest", "least", "coalesce", "nvl",
    "nvl2", "nullif", "nanvl", "isnan", "pi",
];

/// Whether a node is SQL NULL whenever any of its arguments is: arithmetic,
/// negation, casts and the math functions (not `CASE`, `coalesce`,
/// `greatest`, … which may pass over a NULL argument).
pub fn is_strict(shell: &Expr) -> bool {
    match shell {
        Expr::BinaryExpr(b) => is_arithmetic(b.op),
        Expr::Negative(_) | Expr::Cast(_) | Expr::TryCast(_) => true,
        Expr::ScalarFunction(f) => {
            STRICT_FUNCTIONS.contains(&f.func.name())
                || crate::tensor::is_tensor_function(f.func.name())
        }
        _ => false,
    }
}

/// Whether the function `name` never raises an error, whatever its
/// (numeric or tensor) arguments: see [`SAFE_FUNCTIONS`]. Tensor functions
/// are safe (shapes are checked when planning), except `cross_entropy` and
/// `one_hot`, which refuse labels outside the classes' range.
pub fn is_safe_function(name: &str) -> bool {
    SAFE_FUNCTIONS.contains(&name)
        || (crate::tensor::is_tensor_function(name)
            && !name.starts_with("cross_entropy")
            && name != "one_hot")
}

/// Functions that are SQL NULL whenever an argument is.
const STRICT_FUNCTIONS: &[&str] = &[
    "exp", "ln", "log", "log2", "log10", "sqrt", "cbrt", "power", "pow", "sin", "cos", "tan",
    "cot", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "degrees", "radians", "abs", "signum", "floor", "ceil", "round", "trunc", "isnan",
];
