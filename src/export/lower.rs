//! Rewrites of expressions an engine lacks, or evaluates differently from
//! DataFusion, into expressions it runs with DataFusion's meaning.
//!
//! The table is data: one entry per (dialect, function), e.g. PostgreSQL has
//! no `log2`, so `log2(x)` is exported as `ln(x) / ln(2)`. Besides the
//! functions, three operators are lowered where the engines' meanings differ:
//! float `%` (PostgreSQL has none, SQLite truncates to integers), integer `/`
//! (DuckDB divides as floats) and casts from float to integer (PostgreSQL and
//! DuckDB round, DataFusion truncates).

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::functions::math::expr_fn::{abs, floor, isnan, ln, power, signum, tan, trunc};
use datafusion::logical_expr::expr::{Cast, ScalarFunction, TryCast};
use datafusion::logical_expr::{cast, lit, when, BinaryExpr, Expr, ExprSchemable, Operator};

use super::SqlDialect;
use crate::error::{ErrorKind, GradError};

/// A rewrite of one function's call, given its arguments.
type Lowering = fn(Vec<Expr>) -> Result<Expr>;

/// The functions each dialect lacks (or evaluates differently), with their rewrites.
fn lowerings(dialect: SqlDialect) -> &'static [(&'static str, Lowering)] {
    match dialect {
        SqlDialect::DataFusion => &[],
        SqlDialect::DuckDb => &[("nanvl", nanvl)],
        SqlDialect::Postgres => &[
            ("log2", log2),
            ("log", log_base),
            ("nanvl", nanvl),
            ("isnan", isnan_by_compare),
            ("round", round_half_away),
        ],
        SqlDialect::Sqlite => &[
            ("cot", cot),
            ("cbrt", cbrt),
            ("nanvl", nanvl),
            ("isnan", isnan_never),
            ("greatest", greatest),
            ("least", least),
        ],
        SqlDialect::Generic => &[
            ("cot", cot),
            ("log2", log2),
            ("log", log_base),
            ("cbrt", cbrt),
            ("nanvl", nanvl),
            ("isnan", isnan_by_compare),
        ],
    }
}

/// `expr`, over `schema`, with every construct `dialect` lacks rewritten.
pub(crate) fn lower(expr: Expr, schema: &DFSchema, dialect: SqlDialect) -> Result<Expr> {
    let lowered = expr.transform_up(|e| lower_one(e, schema, dialect))?.data;
    if dialect != SqlDialect::DataFusion {
        lowered.apply(|e| {
            let name = match e {
                Expr::ScalarFunction(f) => f.func.name(),
                Expr::AggregateFunction(a) => a.func.name(),
                _ => return Ok(TreeNodeRecursion::Continue),
            };
            if !crate::tensor::is_tensor_function(name)
                && !matches!(name, "tensor" | "tensor_sum" | "tensor_avg")
            {
                return Ok(TreeNodeRecursion::Continue);
            }
            Err(GradError::new(
                ErrorKind::Unexportable,
                format!(
                    "the tensor function `{name}` for {dialect}, which has no tensor columns \
                     (tensor queries export only to DataFusion with datafusion-grad)"
                ),
            )
            .into())
        })?;
    }
    if !matches!(dialect, SqlDialect::DataFusion | SqlDialect::DuckDb) {
        lowered.apply(|e| match e {
            Expr::ScalarFunction(f) if f.func.name() == "named_struct" => Err(GradError::new(
                ErrorKind::Unexportable,
                format!(
                    "a struct value (e.g. `grad(f, x, y)` with several variables) for {dialect}, \
                     which has no struct literals: select its fields, `grad(f, x, y)['x']`"
                ),
            )
            .into()),
            _ => Ok(TreeNodeRecursion::Continue),
        })?;
    }
    Ok(lowered)
}

fn lower_one(e: Expr, schema: &DFSchema, dialect: SqlDialect) -> Result<Transformed<Expr>> {
    match e {
        Expr::ScalarFunction(ScalarFunction { func, args }) if func.name() == "get_field" => {
            match struct_field(&args) {
                Some(field) => Ok(Transformed::yes(field)),
                None => Ok(Transformed::no(Expr::ScalarFunction(ScalarFunction {
                    func,
                    args,
                }))),
            }
        }
        Expr::ScalarFunction(ScalarFunction { func, args }) => {
            match lowerings(dialect).iter().find(|(n, _)| *n == func.name()) {
                Some((_, lowering)) => {
                    // A lowering may call a function the dialect lacks too
                    // (`nanvl` → `isnan`).
                    let name = func.name().to_string();
                    let lowered = lowering(args)?.transform_up(|e| match &e {
                        Expr::ScalarFunction(f) if f.func.name() != name => {
                            lower_one(e, schema, dialect)
                        }
                        _ => Ok(Transformed::no(e)),
                    })?;
                    Ok(Transformed::yes(lowered.data))
                }
                None => Ok(Transformed::no(Expr::ScalarFunction(ScalarFunction {
                    func,
                    args,
                }))),
            }
        }
        Expr::Literal(ScalarValue::Float64(Some(v)), _) if !v.is_finite() => {
            non_finite(v, dialect).map(Transformed::yes)
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let float = is_float(&left, schema) || is_float(&right, schema);
            let lowered = match op {
                Operator::Modulo
                    if float
                        && matches!(
                            dialect,
                            SqlDialect::Postgres | SqlDialect::Sqlite | SqlDialect::Generic
                        ) =>
                {
                    // fmod: the remainder takes the sign of the dividend.
                    Some(
                        *left.clone()
                            - *right.clone() * trunc(vec![*left.clone() / *right.clone()]),
                    )
                }
                Operator::Divide
                    if !float && dialect == SqlDialect::DuckDb && is_integer(&left, schema) =>
                {
                    let t = left.get_type(schema)?;
                    Some(cast(trunc(vec![*left.clone() / *right.clone()]), t))
                }
                _ => None,
            };
            Ok(match lowered {
                Some(e) => Transformed::yes(e),
                None => Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })),
            })
        }
        Expr::Cast(Cast { expr, field })
            if field.data_type().is_integer()
                && is_float(&expr, schema)
                && matches!(
                    dialect,
                    SqlDialect::Postgres | SqlDialect::DuckDb | SqlDialect::Generic
                ) =>
        {
            Ok(Transformed::yes(cast(
                trunc(vec![*expr]),
                field.data_type().clone(),
            )))
        }
        Expr::TryCast(TryCast { expr, field }) if dialect != SqlDialect::DataFusion => {
            try_cast(*expr, field.data_type(), schema, dialect).map(Transformed::yes)
        }
        Expr::AggregateFunction(agg)
            if dialect == SqlDialect::Sqlite && SQLITE_LACKS.contains(&agg.func.name()) =>
        {
            Err(GradError::new(
                ErrorKind::Unexportable,
                format!(
                    "the aggregate `{}` for sqlite, which has no statistical aggregates",
                    agg.func.name()
                ),
            )
            .into())
        }
        e => Ok(Transformed::no(e)),
    }
}

/// DataFusion's statistical aggregates, none of which SQLite has.
const SQLITE_LACKS: [&str; 9] = [
    "var",
    "var_samp",
    "var_pop",
    "stddev",
    "stddev_samp",
    "stddev_pop",
    "covar_samp",
    "covar_pop",
    "corr",
];

/// `TRY_CAST(expr AS to)` in engines without it (PostgreSQL, SQLite): a
/// float or integer to an integer type is the truncated value when it is in
/// the type's range, NULL otherwise (as in DataFusion); any number to a float
/// type is a plain cast. DuckDB keeps `TRY_CAST`, but its casts from floats
/// to integers round, so the value is truncated first.
fn try_cast(expr: Expr, to: &DataType, schema: &DFSchema, dialect: SqlDialect) -> Result<Expr> {
    let from = expr.get_type(schema)?;
    if to.is_floating() && from.is_numeric() {
        return Ok(cast(expr, to.clone()));
    }
    if to.is_integer() && (from.is_floating() || from.is_integer()) {
        let value = match from.is_floating() {
            true => trunc(vec![expr]),
            false => cast(expr, DataType::Float64),
        };
        let bits = to.primitive_width().unwrap_or(8) as i32 * 8;
        let (low, high) = match to.is_signed_integer() {
            true => (-(2f64.powi(bits - 1)), 2f64.powi(bits - 1)),
            false => (0.0, 2f64.powi(bits)),
        };
        return when(
            value
                .clone()
                .gt_eq(lit(low))
                .and(value.clone().lt(lit(high))),
            cast(value, to.clone()),
        )
        .end();
    }
    match dialect {
        SqlDialect::DuckDb => Ok(Expr::TryCast(TryCast::new(Box::new(expr), to.clone()))),
        _ => Err(GradError::new(
            ErrorKind::Unexportable,
            format!("TRY_CAST from {from} to {to} for {dialect}, which has no TRY_CAST"),
        )
        .into()),
    }
}

/// The field that `get_field(args…)` reads from a `named_struct(…)` built in
/// place, if it is one.
fn struct_field(args: &[Expr]) -> Option<Expr> {
    let [Expr::ScalarFunction(inner), Expr::Literal(ScalarValue::Utf8(Some(name)), _)] = args
    else {
        return None;
    };
    if inner.func.name() != "named_struct" {
        return None;
    }
    inner.args.chunks(2).find_map(|pair| match pair {
        [Expr::Literal(ScalarValue::Utf8(Some(n)), _), value] if n == name => Some(value.clone()),
        _ => None,
    })
}

fn is_float(e: &Expr, schema: &DFSchema) -> bool {
    e.get_type(schema).is_ok_and(|t| t.is_floating())
}

fn is_integer(e: &Expr, schema: &DFSchema) -> bool {
    e.get_type(schema).is_ok_and(|t| t.is_integer())
}

/// `±inf` or NaN as a literal the engine reads.
fn non_finite(v: f64, dialect: SqlDialect) -> Result<Expr> {
    if dialect == SqlDialect::Sqlite {
        if v.is_nan() {
            return Err(GradError::new(
                ErrorKind::Unexportable,
                "SQLite has no NaN value (it stores NaN as NULL); this expression needs one",
            )
            .into());
        }
        // 1e999 overflows to infinity when SQLite reads it.
        let inf = Expr::Literal(ScalarValue::Float64(Some(1e308)), None) * lit(10.0);
        return Ok(if v > 0.0 { inf } else { -inf });
    }
    let text = if v.is_nan() {
        "NaN"
    } else if v > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    };
    Ok(cast(lit(text), DataType::Float64))
}

fn arg(args: &[Expr], i: usize) -> Expr {
    args[i].clone()
}

fn log2(args: Vec<Expr>) -> Result<Expr> {
    Ok(ln(arg(&args, 0)) / ln(lit(2.0)))
}

/// `log(b, x) = ln(x) / ln(b)`; one-argument `log` (base 10) is kept.
fn log_base(args: Vec<Expr>) -> Result<Expr> {
    Ok(match args.len() {
        2 => ln(arg(&args, 1)) / ln(arg(&args, 0)),
        _ => Expr::ScalarFunction(ScalarFunction {
            func: datafusion::functions::math::log(),
            args,
        }),
    })
}

fn cot(args: Vec<Expr>) -> Result<Expr> {
    Ok(lit(1.0) / tan(arg(&args, 0)))
}

/// `cbrt(x) = sign(x) · |x|^(1/3)`.
fn cbrt(args: Vec<Expr>) -> Result<Expr> {
    let x = arg(&args, 0);
    Ok(signum(x.clone()) * power(abs(x), lit(1.0 / 3.0)))
}

/// `nanvl(x, y)`: `y` where `x` is NaN.
fn nanvl(args: Vec<Expr>) -> Result<Expr> {
    when(isnan(arg(&args, 0)), arg(&args, 1)).otherwise(arg(&args, 0))
}

/// NaN equals NaN in PostgreSQL's float comparison.
fn isnan_by_compare(args: Vec<Expr>) -> Result<Expr> {
    Ok(arg(&args, 0).eq(cast(lit("NaN"), DataType::Float64)))
}

/// SQLite stores NaN as NULL: no value is NaN (NULL stays NULL).
fn isnan_never(args: Vec<Expr>) -> Result<Expr> {
    when(arg(&args, 0).is_null(), lit(ScalarValue::Boolean(None))).otherwise(lit(false))
}

/// `round(x)` half away from zero (PostgreSQL rounds floats half to even).
fn round_half_away(args: Vec<Expr>) -> Result<Expr> {
    Ok(match args.len() {
        1 => signum(arg(&args, 0)) * floor(abs(arg(&args, 0)) + lit(0.5)),
        _ => Expr::ScalarFunction(ScalarFunction {
            func: datafusion::functions::math::round(),
            args,
        }),
    })
}

/// `greatest` skipping NULLs, as DataFusion does (SQLite's `max(a, b)` is
/// NULL when any argument is).
fn greatest(args: Vec<Expr>) -> Result<Expr> {
    extreme(args, Expr::gt_eq)
}

fn least(args: Vec<Expr>) -> Result<Expr> {
    extreme(args, Expr::lt_eq)
}

fn extreme(args: Vec<Expr>, keeps: fn(Expr, Expr) -> Expr) -> Result<Expr> {
    let mut args = args.into_iter();
    let first = args.next().unwrap_or(lit(ScalarValue::Float64(None)));
    args.try_fold(first, |a, b| {
        when(a.clone().is_null(), b.clone())
            .when(b.clone().is_null(), a.clone())
            .when(keeps(a.clone(), b.clone()), a)
            .otherwise(b)
    })
}
