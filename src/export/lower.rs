//! Rewrites of expressions an engine lacks, or evaluates differently from
//! DataFusion, into expressions it runs with DataFusion's meaning.
//!
//! The table is data: one entry per (dialect, function), e.g. PostgreSQL has
//! no `log2`, so `log2(x)` is exported as `ln(x) / ln(2)`. An entry may also
//! keep the call where the engine agrees with DataFusion and refuse it
//! elsewhere (SQLite's `substr` counts a negative start from the end, so
//! only positive literal starts are exported). Every function left after
//! the rewrites must be one the engine is known to have
//! ([`super::known`]). Besides the functions, three operators are lowered
//! where the engines' meanings differ: float `%` (PostgreSQL has none, SQLite
//! truncates to integers), integer `/` (DuckDB divides as floats) and casts
//! from float to integer (PostgreSQL and DuckDB round, DataFusion
//! truncates); `LIKE` gets DataFusion's escape character `\` spelled out.
//! Refused: `SIMILAR TO` (the unparser prints it as `LIKE`), `LIKE` in
//! SQLite (it ignores ASCII case), casts to text of values the engines write
//! differently (floats, timestamps), and date and time values in SQLite,
//! which has no such types.

use std::f64::consts::PI;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::functions::core::expr_fn::coalesce;
use datafusion::functions::math::expr_fn::{
    abs, ceil, floor, isnan, ln, log10, power, signum, tan, trunc,
};
use datafusion::logical_expr::expr::{Cast, Like, ScalarFunction, TryCast};
use datafusion::logical_expr::{
    cast, lit, when, BinaryExpr, Expr, ExprSchemable, Operator, ScalarUDF,
};

use super::known;
use super::SqlDialect;
use crate::error::{ErrorKind, GradError};

/// One function call being rewritten: the function, its arguments, and the
/// schema they are evaluated over.
struct Call<'a> {
    func: std::sync::Arc<ScalarUDF>,
    args: Vec<Expr>,
    schema: &'a DFSchema,
    dialect: SqlDialect,
}

impl Call<'_> {
    fn arg(&self, i: usize) -> Expr {
        self.args[i].clone()
    }

    /// The call itself, unchanged.
    fn keep(self) -> Result<Expr> {
        Ok(Expr::ScalarFunction(ScalarFunction {
            func: self.func,
            args: self.args,
        }))
    }

    fn arg_type(&self, i: usize) -> Result<DataType> {
        self.args[i].get_type(self.schema)
    }

    /// An [`ErrorKind::Unexportable`] error naming the call, because of `why`.
    fn refuse<T>(&self, why: impl std::fmt::Display) -> Result<T> {
        unexportable(format!(
            "`{}(…)` cannot be exported for {}: {why}",
            self.func.name(),
            self.dialect
        ))
    }
}

/// A rewrite of one function's call.
type Lowering = fn(Call) -> Result<Expr>;

/// The functions each dialect lacks (or evaluates differently), with their rewrites.
fn lowerings(dialect: SqlDialect) -> &'static [(&'static str, Lowering)] {
    match dialect {
        SqlDialect::DataFusion => &[],
        SqlDialect::DuckDb => &[
            ("nanvl", nanvl),
            ("nvl", nvl),
            ("nvl2", nvl2),
            ("round", round_digits),
            ("trunc", trunc_digits),
            ("substr", substr_from_one),
            ("date_part", date_part_fields),
            ("date_trunc", date_trunc_fields),
            ("chr", int_args),
        ],
        SqlDialect::Postgres => &[
            ("log2", log2),
            ("log", log_base),
            ("nanvl", nanvl),
            ("isnan", isnan_by_compare),
            ("round", round_half_away),
            ("trunc", trunc_digits),
            ("nvl", nvl),
            ("nvl2", nvl2),
            ("date_part", date_part_fields),
            ("date_trunc", date_trunc_fields),
            ("chr", int_args),
            ("left", int_args),
            ("right", int_args),
            ("repeat", int_args),
            ("lpad", int_args),
            ("rpad", int_args),
            ("substr", int_args),
            ("split_part", int_args),
        ],
        SqlDialect::Sqlite => &[
            ("cot", cot),
            ("cbrt", cbrt),
            ("nanvl", nanvl),
            ("isnan", isnan_never),
            ("greatest", greatest),
            ("least", least),
            ("round", round_half_away),
            ("trunc", trunc_digits),
            ("nvl", nvl),
            ("nvl2", nvl2),
            ("substr", substr_from_one),
            ("concat", concat_by_pipes),
        ],
        SqlDialect::Generic => &[
            ("cot", cot),
            ("log2", log2),
            ("log", log_ansi),
            ("cbrt", cbrt),
            ("signum", sign_by_case),
            ("nanvl", nanvl),
            ("isnan", isnan_by_compare),
            ("greatest", greatest),
            ("least", least),
            ("round", round_half_away),
            ("trunc", trunc_by_floor_ceil),
            ("degrees", degrees),
            ("radians", radians),
            ("pi", pi),
            ("nvl", nvl),
            ("nvl2", nvl2),
            ("concat", concat_by_pipes),
        ],
    }
}

/// `expr`, over `schema`, with every construct `dialect` lacks rewritten;
/// an [`ErrorKind::Unexportable`] error where one cannot be.
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
                    "cannot export the tensor function `{name}` for {dialect}, which has no tensor columns \
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
                    "cannot export a struct value (e.g. `grad(f, x, y)` with several variables) for {dialect}, \
                     which has no struct literals: select its fields, `grad(f, x, y)['x']`"
                ),
            )
            .into()),
            _ => Ok(TreeNodeRecursion::Continue),
        })?;
    }
    known::check(&lowered, dialect)?;
    Ok(lowered)
}

fn lower_one(e: Expr, schema: &DFSchema, dialect: SqlDialect) -> Result<Transformed<Expr>> {
    refuse_unfaithful(&e, schema, dialect)?;
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
                    let call = Call {
                        func,
                        args,
                        schema,
                        dialect,
                    };
                    let lowered = lowering(call)?.transform_up(|e| match &e {
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
        Expr::Like(like) if like.escape_char.is_none() && dialect != SqlDialect::DataFusion => {
            // DataFusion's LIKE escapes with `\`; DuckDB's has no escape
            // character unless given one.
            Ok(Transformed::yes(Expr::Like(Like {
                escape_char: Some('\\'),
                ..like
            })))
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
                    let t = truncated(*left.clone() / *right.clone(), schema, dialect)?;
                    Some(*left.clone() - *right.clone() * t)
                }
                Operator::Divide
                    if !float && dialect == SqlDialect::DuckDb && is_integer(&left, schema) =>
                {
                    let t = left.get_type(schema)?;
                    let q = truncated(*left.clone() / *right.clone(), schema, dialect)?;
                    Some(cast(q, t))
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
            let t = truncated(*expr, schema, dialect)?;
            Ok(Transformed::yes(cast(t, field.data_type().clone())))
        }
        Expr::TryCast(TryCast { expr, field }) if dialect != SqlDialect::DataFusion => {
            try_cast(*expr, field.data_type(), schema, dialect).map(Transformed::yes)
        }
        e => Ok(Transformed::no(e)),
    }
}

/// `trunc(x)`, `x` already lowered, as `dialect` computes it (ANSI SQL has
/// no `trunc`).
fn truncated(x: Expr, schema: &DFSchema, dialect: SqlDialect) -> Result<Expr> {
    lower_one(trunc(vec![x]), schema, dialect).map(|t| t.data)
}

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
            true => truncated(expr, schema, dialect)?,
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
            format!(
                "cannot export a TRY_CAST from {from} to {to} for {dialect}, which has no TRY_CAST"
            ),
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

/// Refuses `e` where no dialect-independent rewrite keeps DataFusion's
/// meaning: `SIMILAR TO` anywhere (the unparser prints it as `LIKE`), and
/// for the other engines `LIKE` in SQLite (case-insensitive for ASCII
/// there), `ILIKE` in ANSI SQL, casts to text of values the engine writes
/// differently, and date and time values in SQLite.
fn refuse_unfaithful(e: &Expr, schema: &DFSchema, dialect: SqlDialect) -> Result<()> {
    let engine = dialect.title();
    match e {
        Expr::SimilarTo(_) => unexportable(
            "`SIMILAR TO` cannot be exported: DataFusion's unparser prints it as LIKE, \
             which matches other strings",
        ),
        _ if dialect == SqlDialect::DataFusion => Ok(()),
        Expr::Like(_) if dialect == SqlDialect::Sqlite => unexportable(format!(
            "LIKE cannot be exported for {dialect}: {engine}'s LIKE ignores the case of ASCII \
             letters and it has no ILIKE, while DataFusion's LIKE is case-sensitive"
        )),
        Expr::Like(like) if like.case_insensitive && dialect == SqlDialect::Generic => {
            unexportable("ILIKE cannot be exported for generic: it is not ANSI SQL")
        }
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => {
            let to = field.data_type();
            if dialect == SqlDialect::Sqlite && to.is_temporal() {
                return no_dates(dialect);
            }
            if !to.is_string() {
                return Ok(());
            }
            let from = expr.get_type(schema)?;
            match writes_text_alike(&from, dialect) {
                false => unexportable(format!(
                    "a cast of a {from} value to text cannot be exported for {dialect}: \
                     {engine} writes such values as text differently from DataFusion \
                     (e.g. floats: 1e20, timestamps: a space for the `T`)"
                )),
                true => Ok(()),
            }
        }
        Expr::Literal(v, _) if dialect == SqlDialect::Sqlite && v.data_type().is_temporal() => {
            no_dates(dialect)
        }
        _ => Ok(()),
    }
}

/// Whether `dialect` writes values of type `from` as the same text as
/// DataFusion's casts do.
fn writes_text_alike(from: &DataType, dialect: SqlDialect) -> bool {
    match from {
        t if t.is_string() || t.is_integer() || t.is_null() => true,
        DataType::Date32 => dialect != SqlDialect::Sqlite,
        // `true`/`false`: SQLite has no booleans (1/0), ANSI SQL writes TRUE.
        DataType::Boolean => matches!(dialect, SqlDialect::DuckDb | SqlDialect::Postgres),
        _ => false,
    }
}

fn no_dates(dialect: SqlDialect) -> Result<()> {
    unexportable(format!(
        "a date or time value cannot be exported for {dialect}: SQLite has no date or time \
         types (it stores them as text or numbers)"
    ))
}

fn unexportable<T>(message: impl Into<String>) -> Result<T> {
    Err(GradError::new(ErrorKind::Unexportable, message).into())
}

fn log2(c: Call) -> Result<Expr> {
    Ok(ln(c.arg(0)) / ln(lit(2.0)))
}

/// `log(b, x) = ln(x) / ln(b)`; one-argument `log` (base 10) is kept.
fn log_base(c: Call) -> Result<Expr> {
    match c.args.len() {
        2 => Ok(ln(c.arg(1)) / ln(c.arg(0))),
        _ => c.keep(),
    }
}

/// `log(b, x) = ln(x) / ln(b)`; one-argument `log` is `log10` (ANSI SQL has
/// no one-argument `log`).
fn log_ansi(c: Call) -> Result<Expr> {
    match c.args.len() {
        2 => Ok(ln(c.arg(1)) / ln(c.arg(0))),
        _ => Ok(log10(c.arg(0))),
    }
}

fn cot(c: Call) -> Result<Expr> {
    Ok(lit(1.0) / tan(c.arg(0)))
}

/// `cbrt(x) = sign(x) · |x|^(1/3)`.
fn cbrt(c: Call) -> Result<Expr> {
    let x = c.arg(0);
    Ok(signum(x.clone()) * power(abs(x), lit(1.0 / 3.0)))
}

/// `signum(x)` as DataFusion computes it: ±1, 0 at ±0, NaN at NaN.
fn sign_by_case(c: Call) -> Result<Expr> {
    let x = c.arg(0);
    when(x.clone().gt(lit(0.0)), lit(1.0))
        .when(x.clone().lt(lit(0.0)), lit(-1.0))
        .when(x.clone().eq(lit(0.0)), lit(0.0))
        .otherwise(x)
}

/// `degrees(x)`: `x` times the factor DataFusion (Rust's `to_degrees`) uses.
fn degrees(c: Call) -> Result<Expr> {
    Ok(c.arg(0) * lit(1f64.to_degrees()))
}

/// `radians(x)`: `x` times the factor DataFusion (Rust's `to_radians`) uses.
fn radians(c: Call) -> Result<Expr> {
    Ok(c.arg(0) * lit(1f64.to_radians()))
}

fn pi(_: Call) -> Result<Expr> {
    Ok(lit(PI))
}

/// `nanvl(x, y)`: `y` where `x` is NaN.
fn nanvl(c: Call) -> Result<Expr> {
    when(isnan(c.arg(0)), c.arg(1)).otherwise(c.arg(0))
}

/// NaN equals NaN in PostgreSQL's float comparison.
fn isnan_by_compare(c: Call) -> Result<Expr> {
    Ok(c.arg(0).eq(cast(lit("NaN"), DataType::Float64)))
}

/// SQLite stores NaN as NULL: no value is NaN (NULL stays NULL).
fn isnan_never(c: Call) -> Result<Expr> {
    when(c.arg(0).is_null(), lit(ScalarValue::Boolean(None))).otherwise(lit(false))
}

/// `nvl(a, b)` is `coalesce(a, b)`.
fn nvl(c: Call) -> Result<Expr> {
    Ok(coalesce(c.args))
}

/// `nvl2(a, b, c)`: `b` where `a` is not NULL, else `c`.
fn nvl2(c: Call) -> Result<Expr> {
    when(c.arg(0).is_not_null(), c.arg(1)).otherwise(c.arg(2))
}

/// `round(x)` half away from zero, as DataFusion rounds floats (PostgreSQL
/// rounds them half to even, SQLite's `round` is off where `x + 0.5` rounds
/// up, e.g. at 0.49999999999999994), and `round(x, n)` as DataFusion
/// computes it (see [`digits`]). Other types keep the engine's `round`.
fn round_half_away(c: Call) -> Result<Expr> {
    match c.args.len() {
        1 if is_float(&c.args[0], c.schema) => half_away(c.arg(0)),
        1 => c.keep(),
        _ => {
            let (x, factor) = digits(&c)?;
            Ok(half_away(x * lit(factor))? / lit(factor))
        }
    }
}

/// `x` rounded half away from zero, from `trunc(x)`: `x - trunc(x)` is exact.
fn half_away(x: Expr) -> Result<Expr> {
    let t = trunc(vec![x.clone()]);
    when(
        (x.clone() - t.clone()).gt_eq(lit(0.5)),
        t.clone() + lit(1.0),
    )
    .when((t.clone() - x).gt_eq(lit(0.5)), t.clone() - lit(1.0))
    .otherwise(t)
}

/// `round(x, n)` as DataFusion computes it (see [`digits`]); the engine's
/// one-argument `round` already rounds half away from zero.
fn round_digits(c: Call) -> Result<Expr> {
    match c.args.len() {
        1 => c.keep(),
        _ => {
            let (x, factor) = digits(&c)?;
            let func = c.func.clone();
            Ok(func.call(vec![x * lit(factor)]) / lit(factor))
        }
    }
}

/// `trunc(x, n)` as DataFusion computes it (see [`digits`]).
fn trunc_digits(c: Call) -> Result<Expr> {
    match c.args.len() {
        1 => c.keep(),
        _ => {
            let (x, factor) = digits(&c)?;
            Ok(trunc(vec![x * lit(factor)]) / lit(factor))
        }
    }
}

/// `trunc(x)` in ANSI SQL, which has only `floor` and `ceil`; `trunc(x, n)`
/// as DataFusion computes it (see [`digits`]).
fn trunc_by_floor_ceil(c: Call) -> Result<Expr> {
    let (x, factor) = match c.args.len() {
        1 => (c.arg(0), None),
        _ => digits(&c).map(|(x, f)| (x, Some(f)))?,
    };
    let scaled = match factor {
        Some(f) => x * lit(f),
        None => x,
    };
    let truncated =
        when(scaled.clone().gt_eq(lit(0.0)), floor(scaled.clone())).otherwise(ceil(scaled))?;
    Ok(match factor {
        Some(f) => truncated / lit(f),
        None => truncated,
    })
}

/// The float `x` and the factor `10^n` of `round(x, n)` or `trunc(x, n)`,
/// which DataFusion computes as `round(x · 10^n) / 10^n`, with `10^n` from
/// Rust's `powi` (the engines' own two-argument forms scale differently, or
/// exist only for NUMERIC). `n` must be an integer literal with `|n| ≤ 22`,
/// where `10^n` is exact (or the reciprocal of an exact power).
fn digits(c: &Call) -> Result<(Expr, f64)> {
    let n = int_literal(&c.args[1]).filter(|n| n.abs() <= 22);
    match (n, is_float(&c.args[0], c.schema)) {
        (Some(n), true) => Ok((c.arg(0), 10f64.powi(n as i32))),
        _ => c.refuse(format!(
            "`{}(x, n)` is exported only for a float `x` and an integer literal `n` from -22 \
             to 22, computed as DataFusion does",
            c.func.name()
        )),
    }
}

/// The call with its non-literal 64-bit integer arguments cast to 32 bits:
/// the engine declares them `integer` (PostgreSQL's `left(text, integer)`,
/// DuckDB's `chr(integer)`) and finds no function for a BIGINT. A value
/// beyond 32 bits fails the cast there (DataFusion's `chr` fails as well).
fn int_args(mut c: Call) -> Result<Expr> {
    for i in 0..c.args.len() {
        if !matches!(c.args[i], Expr::Literal(..)) && c.arg_type(i)? == DataType::Int64 {
            c.args[i] = cast(c.arg(i), DataType::Int32);
        }
    }
    c.keep()
}

/// `substr(s, start [, length])` where the engine agrees with DataFusion
/// (and PostgreSQL): a start of at least 1 and a length that is not
/// negative, both integer literals (SQLite and DuckDB count a negative start
/// from the end of the string, and take the characters before the start for
/// a negative length, where DataFusion fails).
fn substr_from_one(c: Call) -> Result<Expr> {
    let start = int_literal(&c.args[1]).is_some_and(|s| s >= 1);
    let length = c
        .args
        .get(2)
        .is_none_or(|l| int_literal(l).is_some_and(|l| l >= 0));
    match start && length {
        true => c.keep(),
        false => {
            let engine = c.dialect.title();
            c.refuse(format!(
                "{engine} counts a start below 1 from the end of the string, so the start \
                 must be an integer literal of at least 1 (and the length one of at least 0)"
            ))
        }
    }
}

/// `concat(a, b, …)` as `coalesce(a, '') || coalesce(b, '') || …`:
/// DataFusion's `concat` skips NULLs (the engine has no `concat`, or it is
/// not ANSI SQL). Its arguments are strings: the planner casts others.
fn concat_by_pipes(c: Call) -> Result<Expr> {
    let parts = c.args.into_iter().map(|a| coalesce(vec![a, lit("")]));
    Ok(parts
        .reduce(|a, b| {
            Expr::BinaryExpr(BinaryExpr::new(
                Box::new(a),
                Operator::StringConcat,
                Box::new(b),
            ))
        })
        .unwrap_or_else(|| lit("")))
}

/// The fields `date_part` (`EXTRACT`) agrees on in DataFusion, DuckDB and
/// PostgreSQL for a date or a timestamp without time zone (`dow` counts from
/// Sunday = 0, `week` is ISO's). Not `second` (DataFusion drops its
/// fraction), `epoch` (DuckDB's is an integer) or the sub-second fields.
const DATE_PART_FIELDS: &[&str] = &[
    "year", "quarter", "month", "week", "day", "doy", "dow", "hour", "minute",
];

/// The fields `date_trunc` agrees on in DataFusion, DuckDB and PostgreSQL
/// for a timestamp without time zone (`week` starts on Monday).
const DATE_TRUNC_FIELDS: &[&str] = &[
    "year", "quarter", "month", "week", "day", "hour", "minute", "second",
];

/// `date_part(field, t)` kept for the fields in [`DATE_PART_FIELDS`] of a
/// date or a timestamp without time zone; refused otherwise.
fn date_part_fields(c: Call) -> Result<Expr> {
    date_fields(c, DATE_PART_FIELDS, |t| {
        matches!(
            t,
            DataType::Date32 | DataType::Date64 | DataType::Timestamp(_, None)
        )
    })
}

/// `date_trunc(field, t)` kept for the fields in [`DATE_TRUNC_FIELDS`] of a
/// timestamp without time zone; refused otherwise.
fn date_trunc_fields(c: Call) -> Result<Expr> {
    date_fields(c, DATE_TRUNC_FIELDS, |t| {
        matches!(t, DataType::Timestamp(_, None))
    })
}

fn date_fields(c: Call, fields: &[&str], time_type: fn(&DataType) -> bool) -> Result<Expr> {
    let field = match &c.args[0] {
        Expr::Literal(ScalarValue::Utf8(Some(f)) | ScalarValue::Utf8View(Some(f)), _) => {
            Some(f.to_ascii_lowercase())
        }
        _ => None,
    };
    let field_ok = field.as_deref().is_some_and(|f| fields.contains(&f));
    let ty = c.arg_type(1)?;
    if field_ok && time_type(&ty) {
        return c.keep();
    }
    let engine = c.dialect.title();
    c.refuse(format!(
        "only the fields {} of a date or a timestamp without time zone are known to mean \
         the same in {engine} and DataFusion (here: {} of a {ty})",
        fields.join(", "),
        field.as_deref().unwrap_or("a field that is not a literal")
    ))
}

/// The value of an integer literal, possibly cast.
fn int_literal(e: &Expr) -> Option<i64> {
    match e {
        Expr::Literal(v, _) if v.data_type().is_integer() => match v.cast_to(&DataType::Int64) {
            Ok(ScalarValue::Int64(n)) => n,
            _ => None,
        },
        Expr::Cast(Cast { expr, .. }) | Expr::TryCast(TryCast { expr, .. }) => int_literal(expr),
        _ => None,
    }
}

/// `greatest` skipping NULLs, as DataFusion does (SQLite's `max(a, b)` is
/// NULL when any argument is; ANSI SQL has no `greatest`).
fn greatest(c: Call) -> Result<Expr> {
    extreme(c.args, Expr::gt_eq)
}

fn least(c: Call) -> Result<Expr> {
    extreme(c.args, Expr::lt_eq)
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
