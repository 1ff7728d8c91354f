//! `grad(loss, tbl.col)` as a relation in FROM: the gradient of a loss
//! query with respect to every row of a parameter relation, the form the
//! relational-AD peers use.
//!
//! `loss` names a relation in scope (a CTE, view or table) of one numeric
//! column and one row, the loss (another shape is refused with a typed
//! `shape_mismatch` error: no implicit sum); `tbl` is a relation in scope
//! that the loss reads. The result has `tbl`'s rows and columns, with `col`
//! replaced by `∂loss/∂col` at that row. It is planned as the scalar form
//! `SELECT …, grad((SELECT loss FROM loss), tbl.col) AS col FROM tbl`,
//! which relational reverse mode differentiates (see
//! [`crate::plan::reverse`]), so both forms share one engine.
//!
//! ```sql
//! WITH s AS (SELECT sum(d.x * p.val * p.val) AS loss FROM d JOIN p ON p.g = d.g)
//! SELECT g, val AS gradient FROM grad(s, p.val);
//! ```

use std::sync::Arc;

use futures::FutureExt;

use datafusion::catalog::CatalogProviderList;
use datafusion::common::{DataFusionError, TableReference};
use datafusion::datasource::provider_as_source;
use datafusion::error::Result;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, Subquery};
use datafusion::sql::sqlparser::ast::{
    self, FunctionArg, FunctionArgExpr, ObjectName, ObjectNamePart, TableFactor,
};

use crate::error::{fail, ErrorKind, GradError};

/// Plans `grad(loss, tbl.col)` in FROM; every other table factor is left
/// to DataFusion.
///
/// DataFusion 55 resolves the tables and views of a statement from its FROM
/// clauses before planning it, and the arguments of a table factor are not
/// among them; so a relation named only inside `grad(…)` that is not a CTE
/// is looked up here, in the session's catalogs.
#[derive(Debug)]
pub struct GradRelation {
    catalogs: Arc<dyn CatalogProviderList>,
}

impl GradRelation {
    /// The planner, looking relations up in `catalogs` (the session's).
    pub fn new(catalogs: Arc<dyn CatalogProviderList>) -> Self {
        Self { catalogs }
    }

    /// The relation `parts` names: a CTE or a relation DataFusion resolved,
    /// else a table or view of the session's catalogs.
    fn relation(
        &self,
        parts: &[ast::Ident],
        context: &mut dyn RelationPlannerContext,
    ) -> Result<LogicalPlan> {
        let err = match context.plan(table_named(parts)) {
            Ok(plan) => return Ok(plan),
            Err(err) if err.to_string().contains("not found") => err,
            Err(err) => return Err(err),
        };
        let names: Vec<String> = parts
            .iter()
            .map(|i| context.normalize_ident(i.clone()))
            .collect();
        let reference = match names.as_slice() {
            [t] => TableReference::bare(t.as_str()),
            [s, t] => TableReference::partial(s.as_str(), t.as_str()),
            [c, s, t] => TableReference::full(c.as_str(), s.as_str(), t.as_str()),
            _ => return Err(unresolved(err, parts)),
        };
        let options = &context.context_provider().options().catalog;
        let resolved = reference
            .clone()
            .resolve(&options.default_catalog, &options.default_schema);
        let table = self
            .catalogs
            .catalog(&resolved.catalog)
            .and_then(|c| c.schema(&resolved.schema))
            .map(|s| {
                // A schema that answers at once (in memory, files); one
                // that must wait is left to the typed error.
                s.table(&resolved.table).now_or_never()
            });
        match table {
            Some(Some(Ok(Some(table)))) => {
                LogicalPlanBuilder::scan(reference, provider_as_source(table), None)?.build()
            }
            Some(Some(Err(e))) => Err(e),
            _ => Err(unresolved(err, parts)),
        }
    }
}

impl RelationPlanner for GradRelation {
    fn plan_relation(
        &self,
        relation: TableFactor,
        context: &mut dyn RelationPlannerContext,
    ) -> Result<RelationPlanning> {
        let TableFactor::Table {
            name,
            args: Some(args),
            alias,
            ..
        } = &relation
        else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        if !name.to_string().eq_ignore_ascii_case("grad") {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        }
        let names: Vec<Vec<ast::Ident>> = args
            .args
            .iter()
            .map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(ast::Expr::Identifier(i))) => {
                    Some(vec![i.clone()])
                }
                FunctionArg::Unnamed(FunctionArgExpr::Expr(ast::Expr::CompoundIdentifier(
                    parts,
                ))) => Some(parts.clone()),
                _ => None,
            })
            .collect::<Option<_>>()
            .unwrap_or_default();
        let [loss, variable] = names.as_slice() else {
            return fail(
                ErrorKind::WrongArity,
                format!(
                    "`grad` in FROM takes a loss relation and a column of a parameter relation: \
                     grad(loss, tbl.col); got `{relation}`"
                ),
            );
        };
        let Some((column, table)) = variable.split_last().filter(|(_, t)| !t.is_empty()) else {
            return fail(
                ErrorKind::InvalidWrt,
                format!(
                    "the variable of `{relation}` must name its relation, as in grad(loss, \
                     tbl.col)"
                ),
            );
        };
        let loss_plan = self.relation(loss, context)?;
        let table_plan = self.relation(table, context)?;
        let column = context.normalize_ident(column.clone());
        let loss_plan = one_loss_column(loss_plan, loss)?;
        let grad = context
            .context_provider()
            .get_function_meta("grad")
            .ok_or_else(|| DataFusionError::Plan("grad is not registered".into()))?;
        let schema = Arc::clone(table_plan.schema());
        let variable = schema
            .columns()
            .into_iter()
            .find(|c| c.name == column)
            .ok_or_else(|| missing(&column, &relation.to_string()))?;
        let exprs: Vec<Expr> = schema
            .columns()
            .into_iter()
            .map(|c| match c == variable {
                true => grad
                    .call(vec![
                        Expr::ScalarSubquery(Subquery {
                            subquery: Arc::new(loss_plan.clone()),
                            outer_ref_columns: vec![],
                            spans: Default::default(),
                        }),
                        Expr::Column(c.clone()),
                    ])
                    .alias(&c.name),
                false => Expr::Column(c),
            })
            .collect();
        let plan: LogicalPlan = LogicalPlanBuilder::from(table_plan)
            .project(exprs)?
            .build()?;
        let alias = alias.clone().or_else(|| {
            let last = table.last()?.clone();
            Some(ast::TableAlias {
                at: None,
                explicit: false,
                name: last,
                columns: vec![],
            })
        });
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan, alias,
        ))))
    }
}

/// `plan`, the relation `parts` named as a loss, if it has one numeric
/// column (the loss; its one row is checked when it is computed); a typed
/// error naming its columns otherwise: which column is the loss, or how
/// its rows add up, is the user's to write, never an implicit sum.
fn one_loss_column(plan: LogicalPlan, parts: &[ast::Ident]) -> Result<LogicalPlan> {
    let fields = plan.schema().fields();
    if let [field] = fields.as_ref() {
        if field.data_type().is_numeric() {
            return Ok(plan);
        }
    }
    let name = object_name(parts);
    let columns: Vec<String> = fields
        .iter()
        .map(|f| format!("`{}` {}", f.name(), f.data_type()))
        .collect();
    fail(
        ErrorKind::ShapeMismatch,
        format!(
            "the loss relation `{name}` of grad(…) in FROM has the columns {}; a loss relation \
             has one numeric column and one row: select the loss alone, e.g. WITH l AS \
             (SELECT sum(loss) AS loss FROM {name}) … FROM grad(l, tbl.col)",
            columns.join(", ")
        ),
    )
}

/// The name of the relation `parts`.
fn object_name(parts: &[ast::Ident]) -> ObjectName {
    ObjectName(
        parts
            .iter()
            .cloned()
            .map(ObjectNamePart::Identifier)
            .collect(),
    )
}

/// The table factor naming the relation `parts`.
fn table_named(parts: &[ast::Ident]) -> TableFactor {
    TableFactor::Table {
        name: object_name(parts),
        alias: None,
        args: None,
        with_hints: vec![],
        version: None,
        with_ordinality: false,
        partitions: vec![],
        json_path: None,
        sample: None,
        index_hints: vec![],
    }
}

/// `err` (planning the relation `parts`), explained: neither a CTE nor a
/// relation of the session's catalogs.
fn unresolved(err: DataFusionError, parts: &[ast::Ident]) -> DataFusionError {
    let name = object_name(parts);
    GradError::new(
        ErrorKind::InvalidWrt,
        format!("`{name}` in grad(…) in FROM is neither a CTE of the statement nor a table or view ({err})"),
    )
    .into()
}

/// The error for a variable `column` its relation does not have.
fn missing(column: &str, relation: &str) -> DataFusionError {
    GradError::new(
        ErrorKind::InvalidWrt,
        format!("`{relation}`: the relation has no column `{column}`"),
    )
    .into()
}
