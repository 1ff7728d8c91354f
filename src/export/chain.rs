//! A query printed as a chain of CTEs, one per operator of its plan.
//!
//! The backward pass of relational reverse mode ([`crate::plan::reverse`])
//! is a DAG of joins, aggregates, windows and unions over the forward plan,
//! whose shared parts are read many times. DataFusion's unparser prints a
//! plan as nested derived tables and re-aliases them as it goes, which for
//! these plans gives broken SQL (columns read under an alias the unparser
//! replaced) and repeats every shared part under each reader. Here each
//! operator becomes one CTE with positional columns `c0, c1, …`, printed
//! once however often it is read:
//!
//! ```sql
//! WITH __dfgrad_r0(c0, c1) AS (SELECT "g", "val" FROM p),
//!      __dfgrad_r1(c0, c1) AS (SELECT q.c0, sum(q.c1) FROM __dfgrad_r0 AS q GROUP BY q.c0)
//! SELECT q.c0 AS "g", q.c1 AS "s" FROM __dfgrad_r1 AS q ORDER BY q.c0 ASC NULLS LAST
//! ```
//!
//! Every column is read qualified (`q.cI`, `l.cI`/`r.cI` in a join), so no
//! name of the user's can be captured; the query's own top `ORDER BY` and
//! `LIMIT` are printed in its final `SELECT`, where the order is kept. An
//! operator without a faithful SQL form (a recursive query, a correlated
//! subquery, a mark join, …) is a typed [`ErrorKind::Unexportable`] error.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::default_table_source::provider_as_source;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, NullEquality, ScalarValue};
use datafusion::datasource::empty::EmptyTable;
use datafusion::error::Result;
use datafusion::logical_expr::expr::{Exists, InSubquery};
use datafusion::logical_expr::{
    cast, lit, Aggregate, BinaryExpr, Distinct, Expr, ExprSchemable, Join, JoinType, Limit,
    LogicalPlan, LogicalPlanBuilder, Operator, SortExpr, Subquery,
};

use super::lower::lower;
use super::statement::Printer;
use super::SqlDialect;
use crate::error::{fail, ErrorKind};
use crate::plan::dml::joins_gradient_table;
use crate::plan::reverse::{as_group_join, plain_check};
use crate::plan::shared::shared_input;
use crate::reserved::{export_column, export_relation};

/// Whether `plan` holds a gradient table (relational reverse mode), whose
/// backward pass only prints as a chain.
pub(super) fn has_gradient_table(plan: &LogicalPlan) -> Result<bool> {
    joins_gradient_table(plan)
}

/// `plan` (analyzed, not lowered) as one query: `WITH <chain> SELECT …`.
pub(super) fn query(printer: &Printer, plan: &LogicalPlan) -> Result<String> {
    if printer.dialect() == SqlDialect::Sqlite {
        return fail(
            ErrorKind::Unexportable,
            "cannot export a derivative with respect to a table's rows (relational reverse \
             mode) for SQLite: its gradient table checks that the parameter rows are told \
             apart, and SQLite has no way to fail a query with a message (DuckDB and \
             PostgreSQL do)",
        );
    }
    let mut chain = Chain {
        printer,
        ctes: Vec::new(),
        names: HashMap::new(),
    };
    // The top ORDER BY and LIMIT (and a projection over them) belong to the
    // final SELECT: a CTE does not keep its rows' order.
    let (top, rest) = match plan {
        LogicalPlan::Projection(p)
            if matches!(*p.input, LogicalPlan::Sort(_) | LogicalPlan::Limit(_)) =>
        {
            (Some(p), p.input.as_ref())
        }
        _ => (None, plan),
    };
    let (limit, rest) = match rest {
        LogicalPlan::Limit(l) => (Some(l), l.input.as_ref()),
        _ => (None, rest),
    };
    let (order, rest) = match rest {
        LogicalPlan::Sort(s) if limit.is_none() || s.fetch.is_none() => (Some(s), s.input.as_ref()),
        _ => (None, rest),
    };
    let from = chain.relation(rest)?;
    let scope = [(rest.schema().as_ref(), "q")];
    let select = match top {
        Some(p) => {
            let mut items = Vec::with_capacity(p.expr.len());
            for (e, field) in p.expr.iter().zip(p.schema.fields()) {
                items.push(format!(
                    "{} AS {}",
                    chain.expr(&typed(e, rest.schema())?, &scope)?,
                    printer.ident(field.name())
                ));
            }
            items.join(", ")
        }
        None => {
            let items: Vec<String> = rest
                .schema()
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| format!("q.{} AS {}", export_column(i), printer.ident(f.name())))
                .collect();
            items.join(", ")
        }
    };
    let mut text = format!("SELECT {select} FROM {from} AS q");
    if let Some(s) = order {
        text += &chain.order_by(&s.expr, &scope)?;
        if let Some(fetch) = s.fetch {
            text += &format!(" LIMIT {fetch}");
        }
    }
    if let Some(l) = limit {
        text += &chain.limit(l, &scope)?;
    }
    Ok(format!("WITH {} {text}", chain.ctes.join(", ")))
}

/// The CTEs printed so far, and the name of each operator's.
struct Chain<'a> {
    printer: &'a Printer,
    ctes: Vec<String>,
    names: HashMap<LogicalPlan, String>,
}

/// The inputs an operator's expressions read: each input's schema and the
/// alias it is read under.
type Scope<'s> = [(&'s DFSchema, &'static str)];

impl Chain<'_> {
    /// The name of the CTE of `plan`, printed (with those of its inputs)
    /// unless an equal plan was.
    fn relation(&mut self, plan: &LogicalPlan) -> Result<String> {
        if let Some(input) = shared_input(plan) {
            return self.relation(input);
        }
        if let Some(group_join) = as_group_join(plan) {
            return self.relation(&group_join.plain()?);
        }
        match plan {
            LogicalPlan::SubqueryAlias(s) => return self.relation(&s.input),
            LogicalPlan::Sort(s) if s.fetch.is_none() => return self.relation(&s.input),
            _ => {}
        }
        if let Some(name) = self.names.get(plan) {
            return Ok(name.clone());
        }
        let body = self.body(plan)?;
        let name = export_relation(self.ctes.len());
        let columns: Vec<String> = (0..plan.schema().fields().len().max(1))
            .map(export_column)
            .collect();
        self.ctes
            .push(format!("{name}({}) AS ({body})", columns.join(", ")));
        self.names.insert(plan.clone(), name.clone());
        Ok(name)
    }

    /// The `SELECT` of one operator, over its inputs' CTEs.
    fn body(&mut self, plan: &LogicalPlan) -> Result<String> {
        match plan {
            LogicalPlan::Projection(p) => {
                let from = self.relation(&p.input)?;
                let scope = [(p.input.schema().as_ref(), "q")];
                let mut items = Vec::with_capacity(p.expr.len());
                for e in &p.expr {
                    items.push(self.expr(&typed(e, p.input.schema())?, &scope)?);
                }
                Ok(format!("SELECT {} FROM {from} AS q", named(items)))
            }
            LogicalPlan::Filter(f) => {
                let from = self.relation(&f.input)?;
                let scope = [(f.input.schema().as_ref(), "q")];
                Ok(format!(
                    "SELECT {} FROM {from} AS q WHERE {}",
                    all_columns("q", f.input.schema()),
                    self.expr(&f.predicate, &scope)?
                ))
            }
            LogicalPlan::Join(j) => self.join(j),
            LogicalPlan::Aggregate(a) => self.aggregate(a),
            LogicalPlan::Window(w) => {
                let from = self.relation(&w.input)?;
                let scope = [(w.input.schema().as_ref(), "q")];
                let mut items: Vec<String> = (0..w.input.schema().fields().len())
                    .map(|i| format!("q.{}", export_column(i)))
                    .collect();
                for e in &w.window_expr {
                    items.push(self.expr(e, &scope)?);
                }
                Ok(format!("SELECT {} FROM {from} AS q", named(items)))
            }
            LogicalPlan::Union(u) => {
                let mut branches = Vec::with_capacity(u.inputs.len());
                for input in &u.inputs {
                    let from = self.relation(input)?;
                    branches.push(format!(
                        "SELECT {} FROM {from} AS q",
                        all_columns("q", input.schema())
                    ));
                }
                Ok(branches.join(" UNION ALL "))
            }
            LogicalPlan::Distinct(Distinct::All(input)) => {
                let from = self.relation(input)?;
                Ok(format!(
                    "SELECT DISTINCT {} FROM {from} AS q",
                    all_columns("q", input.schema())
                ))
            }
            LogicalPlan::Sort(s) => {
                let from = self.relation(&s.input)?;
                let scope = [(s.input.schema().as_ref(), "q")];
                let fetch = s.fetch.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
                Ok(format!(
                    "SELECT {} FROM {from} AS q{}{fetch}",
                    all_columns("q", s.input.schema()),
                    self.order_by(&s.expr, &scope)?
                ))
            }
            LogicalPlan::Limit(l) => {
                let (order, input) = match l.input.as_ref() {
                    LogicalPlan::Sort(s) if s.fetch.is_none() => (Some(&s.expr), &s.input),
                    _ => (None, &l.input),
                };
                let from = self.relation(input)?;
                let scope = [(input.schema().as_ref(), "q")];
                let order = match order {
                    Some(order) => self.order_by(order, &scope)?,
                    None => String::new(),
                };
                Ok(format!(
                    "SELECT {} FROM {from} AS q{order}{}",
                    all_columns("q", input.schema()),
                    self.limit(l, &scope)?
                ))
            }
            LogicalPlan::TableScan(t) => {
                let columns: Vec<String> = t
                    .projected_schema
                    .fields()
                    .iter()
                    .map(|f| self.printer.ident(f.name()))
                    .collect();
                let mut text = format!(
                    "SELECT {} FROM {}",
                    columns.join(", "),
                    self.printer.table(&t.table_name)
                );
                if let Some(filter) = t.filters.iter().cloned().reduce(Expr::and) {
                    let filter = filter
                        .transform(|e| match e {
                            Expr::Column(c) => Ok(Transformed::yes(Expr::Column(
                                datafusion::common::Column::new_unqualified(c.name),
                            ))),
                            e => Ok(Transformed::no(e)),
                        })?
                        .data;
                    text += &format!(" WHERE {}", self.printer.expr(&filter)?);
                }
                if let Some(fetch) = t.fetch {
                    text += &format!(" LIMIT {fetch}");
                }
                Ok(text)
            }
            LogicalPlan::Values(v) => {
                let empty = DFSchema::empty();
                let mut rows = Vec::with_capacity(v.values.len());
                for row in &v.values {
                    let mut values = Vec::with_capacity(row.len());
                    for (value, field) in row.iter().zip(v.schema.fields()) {
                        let value = cast(value.clone(), field.data_type().clone());
                        values.push(self.expr(&value, &[(&empty, "q")])?);
                    }
                    rows.push(format!("({})", values.join(", ")));
                }
                Ok(format!("VALUES {}", rows.join(", ")))
            }
            LogicalPlan::EmptyRelation(e) => {
                let empty = DFSchema::empty();
                let mut items = Vec::new();
                for field in e.schema.fields() {
                    let null = ScalarValue::try_from(field.data_type())?;
                    items.push(self.expr(&lit(null), &[(&empty, "q")])?);
                }
                if items.is_empty() {
                    items.push("1".into());
                }
                let none = if e.produce_one_row {
                    ""
                } else {
                    " WHERE 1 = 0"
                };
                Ok(format!("SELECT {}{none}", items.join(", ")))
            }
            other => fail(
                ErrorKind::Unexportable,
                format!(
                    "cannot export {} in a statement that differentiates with respect to a \
                     table's rows (its plan prints as one CTE per operator, and this operator \
                     has no such form)",
                    operator_name(other)
                ),
            ),
        }
    }

    fn join(&mut self, j: &Join) -> Result<String> {
        if j.null_aware {
            return fail(
                ErrorKind::Unexportable,
                "cannot export a null-aware anti join (NOT IN over a subquery) in a statement \
                 that differentiates with respect to a table's rows",
            );
        }
        let (left, right) = (self.relation(&j.left)?, self.relation(&j.right)?);
        let scope = [
            (j.left.schema().as_ref(), "l"),
            (j.right.schema().as_ref(), "r"),
        ];
        let equal = match j.null_equality {
            NullEquality::NullEqualsNull => Operator::IsNotDistinctFrom,
            NullEquality::NullEqualsNothing => Operator::Eq,
        };
        let mut conditions = Vec::new();
        for (l, r) in &j.on {
            let pair = Expr::BinaryExpr(BinaryExpr::new(
                Box::new(l.clone()),
                equal,
                Box::new(r.clone()),
            ));
            conditions.push(self.expr(&pair, &scope)?);
        }
        if let Some(filter) = &j.filter {
            conditions.push(self.expr(filter, &scope)?);
        }
        let on = match conditions.is_empty() {
            true => "TRUE".to_string(),
            false => conditions.join(" AND "),
        };
        let (l_all, r_all) = (
            all_columns("l", j.left.schema()),
            all_columns("r", j.right.schema()),
        );
        let both: Vec<String> = (0..j.left.schema().fields().len())
            .map(|i| format!("l.{}", export_column(i)))
            .chain((0..j.right.schema().fields().len()).map(|i| format!("r.{}", export_column(i))))
            .collect();
        let keyword = match j.join_type {
            JoinType::Inner => "INNER",
            JoinType::Left => "LEFT",
            JoinType::Right => "RIGHT",
            JoinType::Full => "FULL",
            JoinType::LeftSemi | JoinType::LeftAnti | JoinType::RightSemi | JoinType::RightAnti => {
                // The kept side's rows where a row of the other side matches (or none does).
                let (kept, other) = match j.join_type {
                    JoinType::LeftSemi | JoinType::LeftAnti => ((l_all, left, "l"), (right, "r")),
                    _ => ((r_all, right, "r"), (left, "l")),
                };
                let not = match j.join_type {
                    JoinType::LeftAnti | JoinType::RightAnti => "NOT ",
                    _ => "",
                };
                return Ok(format!(
                    "SELECT {} FROM {} AS {} WHERE {not}EXISTS (SELECT 1 FROM {} AS {} WHERE {on})",
                    kept.0, kept.1, kept.2, other.0, other.1
                ));
            }
            JoinType::LeftMark | JoinType::RightMark => {
                return fail(
                    ErrorKind::Unexportable,
                    "cannot export a mark join in a statement that differentiates with \
                     respect to a table's rows",
                )
            }
        };
        Ok(format!(
            "SELECT {} FROM {left} AS l {keyword} JOIN {right} AS r ON {on}",
            named(both)
        ))
    }

    fn aggregate(&mut self, a: &Aggregate) -> Result<String> {
        if a.group_expr
            .iter()
            .any(|e| matches!(e, Expr::GroupingSet(_)))
        {
            return fail(
                ErrorKind::Unexportable,
                "cannot export GROUPING SETS, CUBE or ROLLUP in a statement that \
                 differentiates with respect to a table's rows",
            );
        }
        let from = self.relation(&a.input)?;
        let scope = [(a.input.schema().as_ref(), "q")];
        let mut groups = Vec::with_capacity(a.group_expr.len());
        for e in &a.group_expr {
            groups.push(self.expr(e, &scope)?);
        }
        let mut items = groups.clone();
        for e in &a.aggr_expr {
            items.push(self.expr(e, &scope)?);
        }
        let group_by = match groups.is_empty() {
            true => String::new(),
            false => format!(" GROUP BY {}", groups.join(", ")),
        };
        Ok(format!(
            "SELECT {} FROM {from} AS q{group_by}",
            named(items)
        ))
    }

    fn order_by(&mut self, order: &[SortExpr], scope: &Scope) -> Result<String> {
        let mut keys = Vec::with_capacity(order.len());
        for s in order {
            keys.push(format!(
                "{} {} NULLS {}",
                self.expr(&s.expr, scope)?,
                if s.asc { "ASC" } else { "DESC" },
                if s.nulls_first { "FIRST" } else { "LAST" }
            ));
        }
        Ok(match keys.is_empty() {
            true => String::new(),
            false => format!(" ORDER BY {}", keys.join(", ")),
        })
    }

    fn limit(&mut self, l: &Limit, scope: &Scope) -> Result<String> {
        let mut text = String::new();
        if let Some(fetch) = &l.fetch {
            text += &format!(" LIMIT {}", self.expr(fetch, scope)?);
        }
        if let Some(skip) = &l.skip {
            text += &format!(" OFFSET {}", self.expr(skip, scope)?);
        }
        Ok(text)
    }

    /// One expression over the inputs `scope`: lowered for the dialect,
    /// its columns read by position under their input's alias, its
    /// subqueries read from their CTEs, its NULLs typed.
    fn expr(&mut self, e: &Expr, scope: &Scope) -> Result<String> {
        let mut schema = scope[0].0.clone();
        for (input, _) in &scope[1..] {
            schema = schema.join(input)?;
        }
        let e = e.clone().unalias_nested().data;
        let e = e.transform_up(plain_check)?.data;
        let e = lower(e, &schema, self.printer.dialect())?;
        let e = e.transform_up(|e| self.localize(e, scope))?.data;
        self.printer.expr(&e)
    }

    fn localize(&mut self, e: Expr, scope: &Scope) -> Result<Transformed<Expr>> {
        Ok(match e {
            Expr::Column(c) => {
                let mut found = None;
                for (schema, alias) in scope {
                    if let Some(i) = schema.maybe_index_of_column(&c) {
                        found = Some(datafusion::common::Column::new(
                            Some(*alias),
                            export_column(i),
                        ));
                        break;
                    }
                }
                match found {
                    Some(column) => Transformed::yes(Expr::Column(column)),
                    None => {
                        return fail(
                            ErrorKind::Unexportable,
                            format!(
                            "cannot export a reference to the column `{c}` from outside its query"
                        ),
                        )
                    }
                }
            }
            Expr::Literal(v, _) if v.is_null() && v.data_type() != DataType::Null => {
                let to = v.data_type();
                Transformed::yes(cast(lit(v), to))
            }
            Expr::ScalarSubquery(s) => {
                Transformed::yes(Expr::ScalarSubquery(self.subquery(&s, 1)?))
            }
            Expr::Exists(Exists { subquery, negated }) => Transformed::yes(Expr::Exists(Exists {
                subquery: self.subquery(&subquery, subquery.subquery.schema().fields().len())?,
                negated,
            })),
            Expr::InSubquery(InSubquery {
                expr,
                subquery,
                negated,
            }) => Transformed::yes(Expr::InSubquery(InSubquery {
                expr,
                subquery: self.subquery(&subquery, 1)?,
                negated,
            })),
            Expr::OuterReferenceColumn(..) | Expr::Placeholder(_) => {
                return fail(
                    ErrorKind::Unexportable,
                    format!(
                        "cannot export `{e}` (a correlated subquery or a parameter) in a \
                         statement that differentiates with respect to a table's rows"
                    ),
                )
            }
            e => Transformed::no(e),
        })
    }

    /// `s` as a query of the first `width` columns of its CTE.
    fn subquery(&mut self, s: &Subquery, width: usize) -> Result<Subquery> {
        if !s.outer_ref_columns.is_empty() {
            return fail(
                ErrorKind::Unexportable,
                "cannot export a correlated subquery in a statement that differentiates with \
                 respect to a table's rows",
            );
        }
        let name = self.relation(&s.subquery)?;
        let fields: Vec<Field> = s
            .subquery
            .schema()
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| Field::new(export_column(i), f.data_type().clone(), true))
            .collect();
        let source = provider_as_source(Arc::new(EmptyTable::new(Arc::new(Schema::new(fields)))));
        let columns: Vec<Expr> = (0..width)
            .map(|i| {
                Expr::Column(datafusion::common::Column::new(
                    Some(name.as_str()),
                    export_column(i),
                ))
            })
            .collect();
        let plan = LogicalPlanBuilder::scan(name.as_str(), source, None)?
            .project(columns)?
            .build()?;
        Ok(Subquery {
            subquery: Arc::new(plan),
            ..s.clone()
        })
    }
}

/// `alias.c0, alias.c1, …` for every column of `schema` (`1` if it has none).
fn all_columns(alias: &str, schema: &DFSchema) -> String {
    let items: Vec<String> = (0..schema.fields().len())
        .map(|i| format!("{alias}.{}", export_column(i)))
        .collect();
    match items.is_empty() {
        true => "1".into(),
        false => items.join(", "),
    }
}

/// `items` named `c0, c1, …` in order (DataFusion refuses a projection
/// whose items would get the same name, e.g. one column twice).
fn named(items: Vec<String>) -> String {
    let items: Vec<String> = items
        .into_iter()
        .enumerate()
        .map(|(i, item)| format!("{item} AS {}", export_column(i)))
        .collect();
    items.join(", ")
}

/// `e` cast to its type where it is a bare literal, so that an engine
/// that types `0.0` as NUMERIC (PostgreSQL) types the column as DataFusion does.
fn typed(e: &Expr, schema: &DFSchema) -> Result<Expr> {
    let inner = e.clone().unalias();
    Ok(match &inner {
        Expr::Literal(v, _) if !v.is_null() => cast(inner.clone(), inner.get_type(schema)?),
        _ => e.clone(),
    })
}

/// How an error names an operator of `plan`.
fn operator_name(plan: &LogicalPlan) -> String {
    match plan {
        LogicalPlan::RecursiveQuery(_) => "a recursive query (WITH RECURSIVE)".into(),
        LogicalPlan::Distinct(Distinct::On(_)) => "DISTINCT ON".into(),
        LogicalPlan::Unnest(_) => "UNNEST".into(),
        LogicalPlan::Extension(e) => format!("the operator `{}`", e.node.name()),
        other => format!("the operator `{}`", other.display()),
    }
}
