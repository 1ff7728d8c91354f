//! Export: derivatives as SQL text for other engines.
//!
//! - [`differentiate_sql`]: the derivative of one expression as SQL text,
//!   e.g. `differentiate_sql("x * y", "x", SqlDialect::DuckDb)` is `y`.
//! - [`rewrite_sql`]: a whole statement with every `grad`/`jvp`/`vjp`
//!   replaced by its derivative — through aggregates, derived columns,
//!   recursive CTEs, DML and subqueries — printed for DuckDB, PostgreSQL,
//!   SQLite, DataFusion or generic SQL. Statements without a marker come back
//!   byte for byte.
//!
//! Both use the same differentiation engine as the in-DataFusion path: the
//! statement is planned and analyzed by a session with the markers installed,
//! then printed ([`statement`]) after rewriting what the engine lacks
//! ([`lower`]), checking that every function left is one the engine is known
//! to have with DataFusion's meaning ([`known`]), and fixing what the
//! unparser prints wrongly ([`tidy`]). A statement that cannot be printed
//! faithfully is an [`ErrorKind::Unexportable`](crate::ErrorKind::Unexportable)
//! error.

mod chain;
mod dialect;
pub mod function;
mod known;
mod lower;
mod statement;
// pub for the tests in tests/unit/export_tidy.rs
#[doc(hidden)]
pub mod tidy;

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::{Arc, RwLock};

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{DFSchema, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::{LogicalPlan, ScalarUDF};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::{DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{visit_expressions, visit_relations, Expr as SqlExpr};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

pub use dialect::SqlDialect;

use crate::engine::call::{Marker, MarkerKind};
use crate::error::{ErrorKind, GradError};
use crate::plan::expand::expand_markers;
use crate::rules::Rules;
use statement::Printer;

/// The derivative of the SQL expression `expr` with respect to the column
/// `wrt`, as SQL text of `dialect`.
///
/// Every identifier in `expr` is a DOUBLE column (qualified ones, `a.x`, are
/// distinct from `x`); they are taken to be non-NULL, so no NULL tests appear.
/// Use [`rewrite_sql`] over real tables to keep SQL's NULL semantics.
///
/// ```
/// use datafusion_grad::export::{differentiate_sql, SqlDialect};
///
/// assert_eq!(differentiate_sql("x * y", "x", SqlDialect::DuckDb).unwrap(), "y");
/// assert_eq!(differentiate_sql("sin(x)", "x", SqlDialect::Postgres).unwrap(), "cos(x)");
/// ```
pub fn differentiate_sql(expr: &str, wrt: &str, dialect: SqlDialect) -> Result<String> {
    // DataFusion's functions and the tensor functions, to parse `expr` with.
    let ctx = SessionContext::new();
    crate::tensor::register(&ctx);
    let ast = parse_expr(expr)?;
    let wrt_ast = parse_expr(wrt)?;
    let mut columns = BTreeMap::new();
    for e in [&ast, &wrt_ast] {
        let _: ControlFlow<()> = visit_expressions(e, |e| {
            if let Some((table, name)) = column_of(e) {
                columns.insert((table, name), ());
            }
            ControlFlow::Continue(())
        });
    }
    let fields: Vec<(Option<TableReference>, Arc<Field>)> = columns
        .into_keys()
        .map(|(table, name)| {
            (
                table.map(TableReference::bare),
                Arc::new(Field::new(name, DataType::Float64, false)),
            )
        })
        .collect();
    let schema = DFSchema::new_with_metadata(fields, Default::default())?;
    let f = ctx.parse_sql_expr(expr, &schema)?;
    let x = ctx.parse_sql_expr(wrt, &schema)?;
    let rules = Arc::new(RwLock::new(Rules::builtin()));
    let grad = ScalarUDF::new_from_impl(Marker::new(MarkerKind::Grad, rules));
    let call = grad.call(vec![f, x]);
    let derivative = expand_markers(call, &schema)?.data;
    let derivative = lower::lower(derivative, &schema, dialect)?;
    Printer::new(dialect).expr(&derivative)
}

/// `sql` with every `grad`/`jvp`/`vjp` call replaced by its derivative, as
/// SQL text of `dialect`; tables are those of `ctx`.
///
/// Statements are separated by `;`. If no statement calls a marker, `sql`
/// is returned unchanged. Otherwise each statement with a marker is planned,
/// differentiated and printed, and the others are printed as parsed. DDL
/// statements (`CREATE TABLE`, `CREATE VIEW`, `DROP`, …) are also run in
/// `ctx`, so that the statements after them (and later calls) can be planned.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> datafusion::error::Result<()> {
/// use datafusion_grad::export::{rewrite_sql, SqlDialect};
///
/// let ctx = datafusion_grad::session_context();
/// ctx.sql("CREATE TABLE t (x DOUBLE, y DOUBLE)").await?.collect().await?;
/// let sql = rewrite_sql(&ctx, "SELECT grad(x * x * y, x) AS d FROM t", SqlDialect::Postgres).await?;
/// assert!(!sql.contains("grad("));
/// assert_eq!(rewrite_sql(&ctx, "SELECT x FROM t", SqlDialect::Postgres).await?, "SELECT x FROM t");
/// # Ok(())
/// # }
/// ```
pub async fn rewrite_sql(ctx: &SessionContext, sql: &str, dialect: SqlDialect) -> Result<String> {
    let statements = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})?;
    let any_marker = statements.iter().any(calls_marker);
    let printer = Printer::new(dialect);
    let state = ctx.state();
    let mut out = Vec::with_capacity(statements.len());
    for statement in statements {
        let marked = calls_marker(&statement);
        if !marked && !is_ddl(&statement) {
            out.push(statement.to_string());
            continue;
        }
        let text = (!marked).then(|| statement.to_string());
        let plan = state.statement_to_plan(statement).await?;
        match text {
            Some(text) => out.push(text),
            None => {
                let analyzed = state.analyzer().execute_and_check(
                    plan.clone(),
                    state.config_options(),
                    |_, _| {},
                )?;
                out.push(printer.statement(&analyzed)?);
            }
        }
        if matches!(plan, LogicalPlan::Ddl(_)) {
            ctx.execute_logical_plan(plan).await?.collect().await?;
        }
    }
    if !any_marker {
        return Ok(sql.to_string());
    }
    Ok(match out.len() {
        1 => out.remove(0),
        _ => out.join(";\n") + ";",
    })
}

/// Whether `statement` defines or drops a table or view (run while
/// rewriting, so that later statements can be planned).
fn is_ddl(statement: &DFStatement) -> bool {
    use datafusion::sql::sqlparser::ast::Statement as S;
    match statement {
        DFStatement::Statement(s) => matches!(
            s.as_ref(),
            S::CreateTable(_) | S::CreateView(_) | S::Drop { .. } | S::CreateSchema { .. }
        ),
        DFStatement::CreateExternalTable(_) => true,
        _ => false,
    }
}

/// Whether `statement` calls `grad`, `jvp` or `vjp` (in an expression, or
/// as a relation in FROM).
fn calls_marker(statement: &DFStatement) -> bool {
    match statement {
        DFStatement::Statement(s) => {
            visit_expressions(s.as_ref(), |e| match e {
                SqlExpr::Function(f) if is_marker_name(&f.name.to_string()) => {
                    ControlFlow::Break(())
                }
                _ => ControlFlow::Continue(()),
            })
            .is_break()
                || visit_relations(s.as_ref(), |name| match is_marker_name(&name.to_string()) {
                    true => ControlFlow::Break(()),
                    false => ControlFlow::Continue(()),
                })
                .is_break()
        }
        DFStatement::Explain(e) => calls_marker(&e.statement),
        other => {
            let text = other.to_string().to_ascii_lowercase();
            MarkerKind::ALL
                .iter()
                .any(|k| text.contains(&format!("{}(", k.name())))
        }
    }
}

fn is_marker_name(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    MarkerKind::is_marker_name(last.trim_matches('"'))
}

fn parse_expr(text: &str) -> Result<SqlExpr> {
    let mut parser = Parser::new(&GenericDialect {}).try_with_sql(text)?;
    let e = parser.parse_expr()?;
    if parser.peek_token().token != datafusion::sql::sqlparser::tokenizer::Token::EOF {
        return Err(GradError::new(
            ErrorKind::InvalidWrt,
            format!("`{text}` is not one SQL expression"),
        )
        .into());
    }
    Ok(e)
}

/// The (table, column) an identifier names, normalized as DataFusion does
/// (unquoted names are lowercased).
fn column_of(e: &SqlExpr) -> Option<(Option<String>, String)> {
    let norm = |i: &datafusion::sql::sqlparser::ast::Ident| match i.quote_style {
        Some(_) => i.value.clone(),
        None => i.value.to_ascii_lowercase(),
    };
    match e {
        SqlExpr::Identifier(i) => Some((None, norm(i))),
        SqlExpr::CompoundIdentifier(parts) if parts.len() == 2 => {
            Some((Some(norm(&parts[0])), norm(&parts[1])))
        }
        _ => None,
    }
}
