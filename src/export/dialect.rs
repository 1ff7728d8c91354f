//! The SQL dialects derivatives are exported to.
//!
//! A [`SqlDialect`] decides how the unparser prints identifiers, types and
//! function names ([`Target`]), which functions are rewritten into others
//! before printing ([`super::lower`]) and how float literals are written
//! ([`super::tidy`]).

use std::fmt;
use std::str::FromStr;

use datafusion::sql::sqlparser::ast;
use datafusion::sql::sqlparser::keywords::ALL_KEYWORDS;
use datafusion::sql::unparser::dialect::Dialect;

use crate::error::{ErrorKind, GradError};

/// An SQL engine whose text the exporter writes.
///
/// ```
/// use datafusion_grad::export::SqlDialect;
///
/// let d: SqlDialect = "postgres".parse().unwrap();
/// assert_eq!(d, SqlDialect::Postgres);
/// assert_eq!(d.name(), "postgres");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SqlDialect {
    /// Apache DataFusion (and `dfgrad`) itself.
    DataFusion,
    /// DuckDB.
    DuckDb,
    /// PostgreSQL.
    Postgres,
    /// SQLite (3.35 or later, built with its math functions).
    Sqlite,
    /// ANSI-style SQL without engine-specific functions.
    Generic,
}

impl SqlDialect {
    /// Every dialect, in a stable order.
    pub const ALL: [SqlDialect; 5] = [
        SqlDialect::DataFusion,
        SqlDialect::DuckDb,
        SqlDialect::Postgres,
        SqlDialect::Sqlite,
        SqlDialect::Generic,
    ];

    /// The dialect's name as accepted by [`FromStr`], e.g. `"duckdb"`.
    pub fn name(self) -> &'static str {
        match self {
            SqlDialect::DataFusion => "datafusion",
            SqlDialect::DuckDb => "duckdb",
            SqlDialect::Postgres => "postgres",
            SqlDialect::Sqlite => "sqlite",
            SqlDialect::Generic => "generic",
        }
    }

    /// The engine's name as written in messages, e.g. `"PostgreSQL"`.
    pub fn title(self) -> &'static str {
        match self {
            SqlDialect::DataFusion => "DataFusion",
            SqlDialect::DuckDb => "DuckDB",
            SqlDialect::Postgres => "PostgreSQL",
            SqlDialect::Sqlite => "SQLite",
            SqlDialect::Generic => "ANSI SQL",
        }
    }

    /// The name the engine knows the DataFusion function `name` by, where
    /// it differs (with the same meaning).
    pub(crate) fn rename(self, name: &str) -> Option<&'static str> {
        let renames: &[(&str, &str)] = match self {
            SqlDialect::DataFusion => &[],
            SqlDialect::DuckDb => &[
                ("signum", "sign"),
                ("var", "var_samp"),
                ("stddev", "stddev_samp"),
                ("btrim", "trim"),
                ("octet_length", "strlen"),
            ],
            SqlDialect::Postgres => &[
                ("signum", "sign"),
                ("var", "var_samp"),
                ("stddev", "stddev_samp"),
            ],
            SqlDialect::Generic => &[("var", "var_samp"), ("stddev", "stddev_samp")],
            SqlDialect::Sqlite => &[
                ("signum", "sign"),
                ("character_length", "length"),
                ("btrim", "trim"),
                ("strpos", "instr"),
                ("string_agg", "group_concat"),
            ],
        };
        renames
            .iter()
            .find(|(from, _)| *from == name)
            .map(|(_, to)| *to)
    }
}

impl fmt::Display for SqlDialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SqlDialect {
    type Err = GradError;

    fn from_str(s: &str) -> Result<Self, GradError> {
        let lower = s.to_ascii_lowercase();
        let found = match lower.as_str() {
            "postgresql" | "pg" => Some(SqlDialect::Postgres),
            "sqlite3" => Some(SqlDialect::Sqlite),
            "ansi" => Some(SqlDialect::Generic),
            _ => SqlDialect::ALL.into_iter().find(|d| d.name() == lower),
        };
        found.ok_or_else(|| {
            let names: Vec<&str> = SqlDialect::ALL.iter().map(|d| d.name()).collect();
            GradError::new(
                ErrorKind::Unexportable,
                format!("unknown SQL dialect `{s}`; use one of {}", names.join(", ")),
            )
        })
    }
}

/// The unparser's view of a [`SqlDialect`].
pub(crate) struct Target(pub SqlDialect);

impl Dialect for Target {
    /// Quotes exactly the identifiers that would not read back as themselves
    /// unquoted: keywords, anything but lowercase letters, digits and `_`
    /// (unquoted names are case-folded by the engines), and any name with a
    /// quote in it (which the printer doubles).
    fn identifier_quote_style(&self, identifier: &str) -> Option<char> {
        let plain = identifier
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && identifier
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        let keyword = ALL_KEYWORDS.contains(&identifier.to_ascii_uppercase().as_str());
        (!plain || keyword).then_some('"')
    }

    fn use_array_keyword_for_array_literals(&self) -> bool {
        self.0 == SqlDialect::Postgres
    }

    fn supports_qualify(&self) -> bool {
        false
    }

    fn requires_derived_table_alias(&self) -> bool {
        true
    }

    fn supports_column_alias_in_table_alias(&self) -> bool {
        self.0 != SqlDialect::Sqlite
    }

    fn float64_ast_dtype(&self) -> ast::DataType {
        match self.0 {
            SqlDialect::Postgres | SqlDialect::Generic => ast::DataType::DoublePrecision,
            SqlDialect::Sqlite => ast::DataType::Real,
            SqlDialect::DataFusion | SqlDialect::DuckDb => {
                ast::DataType::Double(ast::ExactNumberInfo::None)
            }
        }
    }

    fn int8_cast_dtype(&self) -> ast::DataType {
        match self.0 {
            SqlDialect::Postgres | SqlDialect::Generic => ast::DataType::SmallInt(None),
            _ => ast::DataType::TinyInt(None),
        }
    }
}
