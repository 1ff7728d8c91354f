//! The functions each engine is known to have with DataFusion's meaning.
//!
//! The table is data: per dialect, the scalar, aggregate and window
//! functions by the name the unparser prints (DataFusion's function name
//! after [`SqlDialect::rename`], e.g. SQLite's `length` for DataFusion's
//! `character_length`). A function is listed only where the engine's
//! function means what DataFusion's does for the argument types the planner
//! gives it; what an engine lacks but can compute otherwise is rewritten
//! first ([`super::lower`]), and where a listed function agrees only for
//! some arguments (e.g. `substr` with a negative start), the rewrite refuses
//! the others. Any other function call is refused with
//! [`ErrorKind::Unexportable`] rather than exported as SQL that fails, or
//! runs with other numbers, in the engine. DataFusion itself (with
//! datafusion-grad) has every function.
//!
//! Left out on purpose (refused everywhere but DataFusion):
//! - `lower`, `upper`, `initcap`: DataFusion maps case by Unicode's full
//!   mappings (`upper('ß')` is `SS`); DuckDB uses the simple ones (`ẞ`),
//!   PostgreSQL its database's locale (only ASCII under `C`), SQLite only
//!   ASCII.
//! - `now`, `current_date`, `current_time`: DataFusion's are UTC, the
//!   engines' follow the session's time zone.
//! - `to_char`, `to_timestamp`, `to_date`, `regexp_*`: other format and
//!   pattern languages.
//! - `median` (DataFusion keeps an integer column's type), `random` in
//!   SQLite (an integer there), `factorial` (overflows differently).

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::logical_expr::expr::{AggregateFunction, NullTreatment, WindowFunction};
use datafusion::logical_expr::{Expr, WindowFunctionDefinition};

use super::SqlDialect;
use crate::error::{ErrorKind, GradError};

/// The functions one dialect has, by printed name.
struct Functions {
    scalar: &'static [&'static str],
    aggregate: &'static [&'static str],
    /// Window functions proper (aggregates used as windows are checked
    /// against `aggregate`).
    window: &'static [&'static str],
}

/// The functions `dialect` is known to have; `None` for DataFusion, which
/// has them all.
fn functions(dialect: SqlDialect) -> Option<&'static Functions> {
    match dialect {
        SqlDialect::DataFusion => None,
        SqlDialect::DuckDb => Some(&DUCKDB),
        SqlDialect::Postgres => Some(&POSTGRES),
        SqlDialect::Sqlite => Some(&SQLITE),
        SqlDialect::Generic => Some(&GENERIC),
    }
}

/// The window functions of SQL:2003/2011, which every engine here has.
const WINDOW: &[&str] = &[
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
];

/// The aggregates DuckDB and PostgreSQL both have with DataFusion's meaning.
#[rustfmt::skip]
const STATISTICAL_AGGREGATES: &[&str] = &[
    "avg", "bool_and", "bool_or", "corr", "count", "covar_pop", "covar_samp", "max", "min",
    "stddev_pop", "stddev_samp", "string_agg", "sum", "var_pop", "var_samp",
];

#[rustfmt::skip]
const DUCKDB: Functions = Functions {
    scalar: &[
        // numeric (`nanvl` is lowered)
        "abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil",
        "cos", "cosh", "cot", "degrees", "exp", "floor", "isnan", "ln", "log", "log10", "log2",
        "pi", "power", "radians", "random", "round", "sign", "sin", "sinh", "sqrt", "tan",
        "tanh", "trunc",
        // conditional
        "coalesce", "nullif", "greatest", "least",
        // strings (`substr` with positive literal bounds)
        "ascii", "bit_length", "character_length", "chr", "concat", "ends_with", "left",
        "ltrim", "md5", "repeat", "replace", "reverse", "right", "rtrim", "split_part",
        "starts_with", "strlen", "strpos", "substr", "translate", "trim",
        // dates (`date_part`, `date_trunc` with the fields both agree on)
        "date_part", "date_trunc", "make_date",
        // structs, printed as struct literals and field access
        "named_struct", "get_field",
    ],
    aggregate: STATISTICAL_AGGREGATES,
    window: WINDOW,
};

#[rustfmt::skip]
const POSTGRES: Functions = Functions {
    scalar: &[
        // numeric (`log2`, `log(b, x)`, `round`, `trunc(x, n)`, `isnan`,
        // `nanvl` are lowered)
        "abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil",
        "cos", "cosh", "cot", "degrees", "exp", "floor", "ln", "log", "log10", "pi", "power",
        "radians", "random", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
        // conditional
        "coalesce", "nullif", "greatest", "least",
        // strings
        "ascii", "bit_length", "btrim", "character_length", "chr", "concat", "left", "lpad",
        "ltrim", "md5", "octet_length", "repeat", "replace", "reverse", "right", "rpad",
        "rtrim", "split_part", "starts_with", "strpos", "substr", "translate",
        // dates (`date_part`, `date_trunc` with the fields both agree on)
        "date_part", "date_trunc", "make_date",
    ],
    aggregate: STATISTICAL_AGGREGATES,
    window: WINDOW,
};

#[rustfmt::skip]
const SQLITE: Functions = Functions {
    scalar: &[
        // numeric: the math functions of 3.35 (`cot`, `cbrt`, `round`,
        // `trunc(x, n)`, `isnan`, `nanvl` are lowered)
        "abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "cos",
        "cosh", "degrees", "exp", "floor", "ln", "log", "log10", "log2", "pi", "power",
        "radians", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
        // conditional (`greatest`, `least` are lowered)
        "coalesce", "nullif",
        // strings (`concat` is lowered to `||`; `substr` with positive
        // literal bounds)
        "instr", "length", "ltrim", "replace", "rtrim", "substr", "trim",
    ],
    aggregate: &["avg", "count", "group_concat", "max", "min", "sum"],
    window: WINDOW,
};

/// The functions of the SQL standard (SQL:2016) with DataFusion's meaning.
#[rustfmt::skip]
const GENERIC: Functions = Functions {
    scalar: &[
        // numeric (`log2`, `log`, `cot`, `cbrt`, `signum`, `round`, `trunc`,
        // `degrees`, `radians`, `pi`, `greatest`, `least`, `isnan`, `nanvl`
        // are lowered)
        "abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "exp", "floor", "ln", "log10",
        "power", "sin", "sinh", "sqrt", "tan", "tanh",
        // conditional
        "coalesce", "nullif",
        // strings (`concat` is lowered to `||`)
        "character_length", "octet_length",
    ],
    aggregate: &[
        "avg", "corr", "count", "covar_pop", "covar_samp", "max", "min", "stddev_pop",
        "stddev_samp", "sum", "var_pop", "var_samp",
    ],
    window: WINDOW,
};

/// What a function call is, for the table and for messages.
#[derive(Clone, Copy)]
enum Kind {
    Scalar,
    Aggregate,
    Window,
}

impl Kind {
    fn list(self, functions: &Functions) -> &'static [&'static str] {
        match self {
            Kind::Scalar => functions.scalar,
            Kind::Aggregate => functions.aggregate,
            Kind::Window => functions.window,
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Scalar => "function",
            Kind::Aggregate => "aggregate function",
            Kind::Window => "window function",
        }
    }
}

/// Fails with [`ErrorKind::Unexportable`] at the first function call in
/// `expr` (already lowered) that `dialect` is not known to have, and in any
/// dialect at a call the unparser would print without one of its parts (an
/// aggregate's `ORDER BY`, `IGNORE NULLS`).
pub(crate) fn check(expr: &Expr, dialect: SqlDialect) -> Result<()> {
    expr.apply(|e| {
        let (name, kind) = match e {
            Expr::ScalarFunction(f) => (f.func.name(), Kind::Scalar),
            Expr::AggregateFunction(AggregateFunction { func, params }) => {
                if !params.order_by.is_empty() && !func.supports_within_group_clause() {
                    return refuse(format!(
                        "the ORDER BY inside `{}(…)` cannot be exported: DataFusion's unparser \
                         drops it, which would change the result",
                        func.name()
                    ));
                }
                ignore_nulls(func.name(), params.null_treatment)?;
                (func.name(), Kind::Aggregate)
            }
            Expr::WindowFunction(w) => {
                let WindowFunction { fun, params } = w.as_ref();
                ignore_nulls(fun.name(), params.null_treatment)?;
                match fun {
                    WindowFunctionDefinition::AggregateUDF(f) => (f.name(), Kind::Aggregate),
                    WindowFunctionDefinition::WindowUDF(f) => (f.name(), Kind::Window),
                }
            }
            _ => return Ok(TreeNodeRecursion::Continue),
        };
        let Some(functions) = functions(dialect) else {
            return Ok(TreeNodeRecursion::Continue);
        };
        let printed = dialect.rename(name).unwrap_or(name);
        match kind.list(functions).contains(&printed) {
            true => Ok(TreeNodeRecursion::Continue),
            false => refuse(format!(
                "{} has no {} `{name}` known to mean what DataFusion's does, so a call of it \
                 cannot be exported for {dialect}",
                dialect.title(),
                kind.noun()
            )),
        }
    })?;
    Ok(())
}

/// Refuses `IGNORE NULLS`, which the unparser does not print.
fn ignore_nulls(name: &str, treatment: Option<NullTreatment>) -> Result<()> {
    match treatment {
        Some(NullTreatment::IgnoreNulls) => refuse(format!(
            "`{name}(…) IGNORE NULLS` cannot be exported: DataFusion's unparser drops \
             IGNORE NULLS, which would change the result"
        )),
        _ => Ok(()),
    }
}

fn refuse<T>(message: String) -> Result<T> {
    Err(GradError::new(ErrorKind::Unexportable, message).into())
}
