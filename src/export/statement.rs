//! Printing a differentiated plan back as one SQL statement.
//!
//! DataFusion's unparser prints queries; this module adds what it cannot:
//! recursive CTEs (each `RecursiveQuery` is printed as a `WITH RECURSIVE`
//! entry, its static and recursive terms unparsed separately), `INSERT`,
//! `UPDATE` and `DELETE`, `CREATE TABLE … AS` and `CREATE VIEW`. Anything else
//! is a typed [`ErrorKind::Unexportable`] error, never broken SQL.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::catalog::default_table_source::provider_as_source;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, NullEquality, TableReference};
use datafusion::datasource::empty::EmptyTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    cast, BinaryExpr, DdlStatement, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder, Operator,
    Projection, RecursiveQuery, WriteOp,
};
use datafusion::sql::sqlparser::ast::{
    Ident, ObjectName, ObjectNamePart, SetExpr, Statement as SqlStatement, TableFactor, VisitMut,
    VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::unparser::dialect::Dialect;
use datafusion::sql::unparser::Unparser;

use super::chain;
use super::dialect::Target;
use super::lower::lower;
use super::tidy::tidy;
use super::SqlDialect;
use crate::error::{ErrorKind, GradError};
use crate::plan::bindings::printable;
use crate::reserved::is_tangent_column;

/// Prints plans as statements of one dialect.
pub(crate) struct Printer {
    target: Target,
}

impl Printer {
    pub(crate) fn new(dialect: SqlDialect) -> Self {
        Self {
            target: Target(dialect),
        }
    }

    pub(super) fn dialect(&self) -> SqlDialect {
        self.target.0
    }

    /// `plan` (analyzed, without markers) as one statement.
    pub(crate) fn statement(&self, plan: &LogicalPlan) -> Result<String> {
        // A plan with a gradient table prints as a chain of CTEs, lowered
        // operator by operator ([`chain`]).
        let plan = match chain::has_gradient_table(plan)? {
            true => plan.clone(),
            false => self.lower_plan(null_equal_joins(plan.clone())?)?,
        };
        match &plan {
            LogicalPlan::Dml(dml) => match &dml.op {
                WriteOp::Insert(InsertOp::Append) => Ok(format!(
                    "INSERT INTO {} ({}) {}",
                    self.table(&dml.table_name),
                    self.column_list(dml.input.schema()),
                    self.query(&dml.input)?
                )),
                WriteOp::Update => self.update(&dml.table_name, &dml.input),
                WriteOp::Delete => {
                    let (_, predicate) = self.flatten(&dml.input)?;
                    Ok(format!(
                        "DELETE FROM {}{}",
                        self.table(&dml.table_name),
                        self.where_clause(predicate)?
                    ))
                }
                op => unexportable(format!("`{op}` statements")),
            },
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(c)) => Ok(format!(
                "CREATE TABLE {}{} AS {}",
                if c.if_not_exists {
                    "IF NOT EXISTS "
                } else {
                    ""
                },
                self.table(&c.name),
                self.query(&c.input)?
            )),
            LogicalPlan::Ddl(DdlStatement::CreateView(v)) => Ok(format!(
                "CREATE VIEW {} AS {}",
                self.table(&v.name),
                self.query(&v.input)?
            )),
            LogicalPlan::Ddl(_)
            | LogicalPlan::Explain(_)
            | LogicalPlan::Analyze(_)
            | LogicalPlan::Statement(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::DescribeTable(_) => unexportable(format!(
                "this kind of statement ({})",
                plan.display().to_string().trim()
            )),
            _ => self.query(&plan),
        }
    }

    /// A query, with its recursive CTEs hoisted into one `WITH RECURSIVE`.
    fn query(&self, plan: &LogicalPlan) -> Result<String> {
        if chain::has_gradient_table(plan)? {
            return chain::query(self, plan);
        }
        let mut ctes = Vec::new();
        let plan = self.hoist_recursive(plan.clone(), &mut ctes)?;
        let body = self.unparse(&plan)?;
        Ok(match ctes.is_empty() {
            true => body,
            false => format!("WITH RECURSIVE {} {body}", ctes.join(", ")),
        })
    }

    /// `plan` printed by DataFusion's unparser (its binding projections made
    /// printable first, its `VALUES` lists, which the unparser cannot print,
    /// printed by [`Self::insert_values`]), then tidied.
    fn unparse(&self, plan: &LogicalPlan) -> Result<String> {
        let mut lists = Vec::new();
        let plan = values_as_scans(printable(plan.clone())?, &mut lists)?;
        let mut statement = Unparser::new(&self.target)
            .plan_to_sql(&plan)
            .map_err(|e| cannot_print(&e))?;
        self.insert_values(&mut statement, &lists)?;
        tidy(&mut statement, self.dialect());
        Ok(statement.to_string())
    }

    /// `statement` with each scan of a placeholder of [`values_as_scans`]
    /// replaced by its `VALUES` list, as a derived table under the name (and
    /// column names) the statement reads it by: `(VALUES (…), (…)) AS
    /// t(a, b)`; SQLite, which takes no column names in a table alias and
    /// names a `VALUES` list's columns `column1`, `column2`, … as DataFusion
    /// does, gets `(SELECT column1 AS a, … FROM (VALUES (…), (…))) AS t`.
    fn insert_values(&self, statement: &mut SqlStatement, lists: &[ValuesList]) -> Result<()> {
        if lists.is_empty() {
            return Ok(());
        }
        let mut inserted = 0;
        let outcome = statement.visit(&mut TableFactors(|factor: &mut TableFactor| {
            let TableFactor::Table { name, alias, .. } = factor else {
                return ControlFlow::Continue(());
            };
            let Some(list) = values_index(name).and_then(|i| lists.get(i)) else {
                return ControlFlow::Continue(());
            };
            let (table, columns) = match alias {
                Some(alias) => (
                    alias.name.value.clone(),
                    alias.columns.iter().map(|c| c.name.value.clone()).collect(),
                ),
                None => (name.to_string(), Vec::new()),
            };
            let columns = match columns.is_empty() {
                true => list.columns.clone(),
                false => columns,
            };
            match self.values_table(list, &table, &columns) {
                Ok(values) => {
                    *factor = values;
                    inserted += 1;
                    ControlFlow::Continue(())
                }
                Err(e) => ControlFlow::Break(e),
            }
        }));
        if let ControlFlow::Break(e) = outcome {
            return Err(e);
        }
        if inserted != lists.len() {
            return unexportable(
                "a VALUES list that the unparser moved where it cannot be printed",
            );
        }
        Ok(())
    }

    /// The derived table of `list` named `table` with `columns` (see
    /// [`Self::insert_values`]).
    fn values_table(
        &self,
        list: &ValuesList,
        table: &str,
        columns: &[String],
    ) -> Result<TableFactor> {
        let unparser = Unparser::new(&self.target);
        let mut rows = Vec::with_capacity(list.rows.len());
        for row in &list.rows {
            let mut values = Vec::with_capacity(row.len());
            for value in row {
                values.push(
                    unparser
                        .expr_to_sql(value)
                        .map_err(|e| cannot_print(&e))?
                        .to_string(),
                );
            }
            rows.push(format!("({})", values.join(", ")));
        }
        let rows = rows.join(", ");
        let table = self.ident(table);
        let sql = match self.dialect() {
            SqlDialect::Sqlite => {
                let select: Vec<String> = columns
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("column{} AS {}", i + 1, self.ident(c)))
                    .collect();
                format!(
                    "SELECT * FROM (SELECT {} FROM (VALUES {rows})) AS {table}",
                    select.join(", ")
                )
            }
            _ => {
                let names: Vec<String> = columns.iter().map(|c| self.ident(c)).collect();
                format!(
                    "SELECT * FROM (VALUES {rows}) AS {table} ({})",
                    names.join(", ")
                )
            }
        };
        let parsed = Parser::parse_sql(&GenericDialect {}, &sql)?.pop();
        if let Some(SqlStatement::Query(query)) = parsed {
            if let SetExpr::Select(select) = *query.body {
                if let Some(from) = select.from.into_iter().next() {
                    return Ok(from.relation);
                }
            }
        }
        unexportable("a VALUES list")
    }

    /// `plan` with each recursive query replaced by a scan of its name, and
    /// the queries printed into `ctes` (inner ones first).
    fn hoist_recursive(&self, plan: LogicalPlan, ctes: &mut Vec<String>) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            let LogicalPlan::RecursiveQuery(rq) = node else {
                return Ok(Transformed::no(node));
            };
            let cte = self.recursive_cte(&rq, ctes)?;
            ctes.push(cte);
            let schema = Arc::new(rq.static_term.schema().as_arrow().clone());
            let source = provider_as_source(Arc::new(EmptyTable::new(schema)));
            let scan = LogicalPlanBuilder::scan(rq.name.as_str(), source, None)?.build()?;
            Ok(Transformed::yes(scan))
        })
        .map(|t| t.data)
    }

    fn recursive_cte(&self, rq: &RecursiveQuery, ctes: &mut Vec<String>) -> Result<String> {
        if matches!(self.dialect(), SqlDialect::Postgres | SqlDialect::Sqlite)
            && has_aggregate(&rq.recursive_term)?
        {
            return unexportable(format!(
                "the recursive query `{}`: {} allows no aggregate or window functions in the \
                 recursive term of WITH RECURSIVE (DuckDB and DataFusion do)",
                rq.name,
                self.dialect()
            ));
        }
        let tangents = rq
            .static_term
            .schema()
            .fields()
            .iter()
            .any(|f| is_tangent_column(f.name()));
        if tangents && (self.dialect() == SqlDialect::Sqlite || has_aggregate(&rq.recursive_term)?)
        {
            return unexportable(format!(
                "the recursive query `{}` with the tangents of a derivative through its \
                 iterations for {}: exported where its steps do not aggregate, for DuckDB, \
                 PostgreSQL and DataFusion",
                rq.name,
                self.dialect()
            ));
        }
        let static_term = self.hoist_recursive(typed_literals(&rq.static_term)?, ctes)?;
        let recursive_term = self.hoist_recursive(rq.recursive_term.as_ref().clone(), ctes)?;
        Ok(format!(
            "{}({}) AS ({} UNION {}{})",
            self.ident(&rq.name),
            self.column_list(rq.static_term.schema()),
            self.unparse(&static_term)?,
            if rq.is_distinct { "" } else { "ALL " },
            self.unparse(&recursive_term)?
        ))
    }

    /// `UPDATE t SET … WHERE …` from DataFusion's update plan (a projection of
    /// every column over a filtered scan, with any projections the analyzer
    /// inserted to share subexpressions inlined).
    fn update(&self, table: &TableReference, input: &LogicalPlan) -> Result<String> {
        let (values, predicate) = self.flatten(input)?;
        let mut sets = Vec::new();
        for field in input.schema().fields() {
            let value = &values[field.name()];
            if matches!(value, Expr::Column(c) if c.name == *field.name()) {
                continue;
            }
            sets.push(format!(
                "{} = {}",
                self.ident(field.name()),
                self.expr(value)?
            ));
        }
        if sets.is_empty() {
            return unexportable("an UPDATE that sets nothing");
        }
        Ok(format!(
            "UPDATE {} SET {}{}",
            self.table(table),
            sets.join(", "),
            self.where_clause(predicate)?
        ))
    }

    /// The output columns of a chain of projections and filters over one
    /// table scan, as expressions over the scanned columns, and the filters'
    /// conjunction.
    fn flatten(&self, plan: &LogicalPlan) -> Result<(HashMap<String, Expr>, Option<Expr>)> {
        match plan {
            LogicalPlan::TableScan(scan) if scan.filters.is_empty() => Ok((
                scan.projected_schema
                    .fields()
                    .iter()
                    .map(|f| {
                        (
                            f.name().clone(),
                            Expr::Column(Column::new_unqualified(f.name())),
                        )
                    })
                    .collect(),
                None,
            )),
            LogicalPlan::Projection(p) => {
                let (below, predicate) = self.flatten(&p.input)?;
                let mut values = HashMap::new();
                for (e, field) in p.expr.iter().zip(p.schema.fields()) {
                    values.insert(
                        field.name().clone(),
                        substitute(e.clone().unalias(), &below)?,
                    );
                }
                Ok((values, predicate))
            }
            LogicalPlan::Filter(f) => {
                let (values, predicate) = self.flatten(&f.input)?;
                let here = substitute(f.predicate.clone(), &values)?;
                let predicate = match predicate {
                    Some(p) => p.and(here),
                    None => here,
                };
                Ok((values, Some(predicate)))
            }
            other => unexportable(format!(
                "an UPDATE or DELETE over `{}` (only a filtered single-table scan prints as one)",
                other.display()
            )),
        }
    }

    fn where_clause(&self, predicate: Option<Expr>) -> Result<String> {
        Ok(match predicate {
            Some(p) => format!(" WHERE {}", self.expr(&p)?),
            None => String::new(),
        })
    }

    /// One expression in this dialect.
    pub(crate) fn expr(&self, e: &Expr) -> Result<String> {
        let mut ast = Unparser::new(&self.target)
            .expr_to_sql(e)
            .map_err(|e| cannot_print(&e))?;
        tidy(&mut ast, self.dialect());
        Ok(ast.to_string())
    }

    /// An identifier, quoted where it must be.
    pub(crate) fn ident(&self, name: &str) -> String {
        match self.target.identifier_quote_style(name) {
            Some(q) => Ident::with_quote(q, name).to_string(),
            None => Ident::new(name).to_string(),
        }
    }

    /// The names of `schema`'s columns, quoted where they must be, comma-separated.
    fn column_list(&self, schema: &DFSchema) -> String {
        let names: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| self.ident(f.name()))
            .collect();
        names.join(", ")
    }

    pub(super) fn table(&self, table: &TableReference) -> String {
        let parts: Vec<String> = table.to_vec().iter().map(|p| self.ident(p)).collect();
        parts.join(".")
    }

    /// `plan` with [`lower`] applied to every expression (names kept).
    fn lower_plan(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        let dialect = self.dialect();
        plan.transform_up_with_subqueries(|node| {
            let schema = input_schema(&node)?;
            let names = NamePreserver::new(&node);
            let t = node.map_expressions(|e| {
                let saved = names.save(&e);
                let lowered = lower(e.clone(), &schema, dialect)?;
                Ok(match lowered == e {
                    true => Transformed::no(e),
                    false => Transformed::yes(saved.restore(lowered)),
                })
            })?;
            match t.transformed {
                true => Ok(Transformed::yes(t.data.recompute_schema()?)),
                false => Ok(t),
            }
        })
        .map(|t| t.data)
    }
}

/// Prefix of the names of the placeholder tables that stand for `VALUES`
/// lists while the unparser prints a plan.
const VALUES_PREFIX: &str = "__dfgrad_values_";

/// A `VALUES` list to print: its rows, each value cast to its column's type
/// (`1.0` would be NUMERIC in PostgreSQL), and DataFusion's names of its
/// columns (`column1`, …).
struct ValuesList {
    rows: Vec<Vec<Expr>>,
    columns: Vec<String>,
}

/// `plan` with each `VALUES` list, which DataFusion's unparser cannot print,
/// replaced by a scan of a placeholder table (`__dfgrad_values_N`, N its
/// index in `lists`), which [`Printer::insert_values`] replaces in the
/// printed statement.
fn values_as_scans(plan: LogicalPlan, lists: &mut Vec<ValuesList>) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::Values(values) = &node else {
            return Ok(Transformed::no(node));
        };
        let fields = values.schema.fields();
        let rows = values
            .values
            .iter()
            .map(|row| {
                row.iter()
                    .zip(fields)
                    .map(|(value, field)| cast(value.clone(), field.data_type().clone()))
                    .collect()
            })
            .collect();
        let name = format!("{VALUES_PREFIX}{}", lists.len());
        lists.push(ValuesList {
            rows,
            columns: fields.iter().map(|f| f.name().clone()).collect(),
        });
        let schema = Arc::new(values.schema.as_arrow().clone());
        let source = provider_as_source(Arc::new(EmptyTable::new(schema)));
        let scan = LogicalPlanBuilder::scan(name.as_str(), source, None)?.build()?;
        Ok(Transformed::yes(scan))
    })
    .map(|t| t.data)
}

/// Calls its function on every table factor of a statement, outer ones
/// first.
struct TableFactors<F>(F);

impl<F: FnMut(&mut TableFactor) -> ControlFlow<DataFusionError>> VisitorMut for TableFactors<F> {
    type Break = DataFusionError;

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<DataFusionError> {
        (self.0)(factor)
    }
}

/// The index of the `VALUES` list a placeholder table name stands for.
fn values_index(name: &ObjectName) -> Option<usize> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => {
            ident.value.strip_prefix(VALUES_PREFIX)?.parse().ok()
        }
        _ => None,
    }
}

/// The schema a node's expressions are evaluated over.
pub(crate) fn input_schema(node: &LogicalPlan) -> Result<DFSchema> {
    let inputs = node.inputs();
    if matches!(node, LogicalPlan::Union(_) | LogicalPlan::RecursiveQuery(_)) {
        // Its inputs' columns are its own, by position (and it has no
        // expressions).
        return Ok(node.schema().as_ref().clone());
    }
    let Some((first, rest)) = inputs.split_first() else {
        return Ok(node.schema().as_ref().clone());
    };
    let mut schema = first.schema().as_ref().clone();
    for input in rest {
        schema = schema.join(input.schema())?;
    }
    Ok(schema)
}

/// The static term with its top-level literals cast to their types, so that
/// engines which type `0.0` as NUMERIC (PostgreSQL) agree with the recursive term.
fn typed_literals(static_term: &LogicalPlan) -> Result<LogicalPlan> {
    let LogicalPlan::Projection(p) = static_term else {
        return Ok(static_term.clone());
    };
    let schema = p.input.schema();
    let exprs = p
        .expr
        .iter()
        .zip(p.schema.fields())
        .map(|(e, field)| {
            let inner = e.clone().unalias();
            Ok(match inner {
                Expr::Literal(..) => {
                    cast(inner.clone(), inner.get_type(schema)?).alias(field.name())
                }
                _ => e.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::clone(&p.input),
    )?))
}

fn has_aggregate(plan: &LogicalPlan) -> Result<bool> {
    let mut found = false;
    plan.apply_with_subqueries(|node| {
        found |= matches!(node, LogicalPlan::Aggregate(_) | LogicalPlan::Window(_));
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    })?;
    Ok(found)
}

/// `e` with each column replaced by its definition in `values`.
fn substitute(e: Expr, values: &HashMap<String, Expr>) -> Result<Expr> {
    e.transform(|e| match &e {
        Expr::Column(c) => match values.get(&c.name) {
            Some(v) => Ok(Transformed::yes(v.clone())),
            None => Ok(Transformed::no(e)),
        },
        _ => Ok(Transformed::no(e)),
    })
    .map(|t| t.data)
}

/// The error of the unparser's refusal `e`, as one readable sentence: the
/// unparser's messages carry Rust debug dumps of the plan node or expression
/// (`Unsupported operator: Union(Union { inputs: [...`), of which only the
/// node's name is kept.
fn cannot_print(e: &DataFusionError) -> DataFusionError {
    GradError::new(
        ErrorKind::Unexportable,
        format!(
            "cannot export this statement as SQL text: DataFusion's unparser cannot print it ({})",
            readable(&e.to_string())
        ),
    )
    .into()
}

/// The first line of a DataFusion message `text` without its category
/// prefix (`This feature is not implemented: `) and cut before the first
/// Rust debug dump (`Name(Struct { … })`, `Name { … }`).
fn readable(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    let line = [
        "This feature is not implemented: ",
        "Internal error: ",
        "Error during planning: ",
    ]
    .iter()
    .fold(line, |line, prefix| {
        line.strip_prefix(*prefix).unwrap_or(line)
    });
    let cut = match line.find(" { ") {
        Some(brace) => line[..brace].rfind('(').filter(|&p| p > 0).unwrap_or(brace),
        None => line.len(),
    };
    let line = line[..cut].trim_end_matches([':', ' ', '(']);
    line.strip_suffix('.').unwrap_or(line).to_string()
}

fn unexportable<T>(what: impl std::fmt::Display) -> Result<T> {
    Err(GradError::new(
        ErrorKind::Unexportable,
        format!("cannot export {what} as SQL text"),
    )
    .into())
}

/// `plan` with each equi-join that matches NULL keys (the key joins of
/// relational reverse mode) written with `IS NOT DISTINCT FROM` in its
/// filter: the unparser prints every equi-join key as `=`.
fn null_equal_joins(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| match node {
        LogicalPlan::Join(mut j)
            if j.null_equality == NullEquality::NullEqualsNull && !j.on.is_empty() =>
        {
            let keys = std::mem::take(&mut j.on).into_iter().map(|(l, r)| {
                Expr::BinaryExpr(BinaryExpr::new(
                    Box::new(l),
                    Operator::IsNotDistinctFrom,
                    Box::new(r),
                ))
            });
            j.filter = keys.chain(j.filter.take()).reduce(Expr::and);
            j.null_equality = NullEquality::NullEqualsNothing;
            Ok(Transformed::yes(LogicalPlan::Join(j)))
        }
        node => Ok(Transformed::no(node)),
    })
    .map(|t| t.data)
}
