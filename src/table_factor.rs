//! `grad(loss, tbl.col)` as a relation in FROM: the gradient of a loss
//! query with respect to every row of a parameter relation, the form the
//! relational-AD peers use.
//!
//! `loss` names a relation in scope (a CTE, view or table) whose first
//! column is the loss (summed over its rows); `tbl` is a relation in scope
//! that the loss reads. The result has `tbl`'s rows and columns, with `col`
//! replaced by `∂loss/∂col` at that row. It is planned as the scalar form
//! `SELECT …, grad((SELECT sum(loss) FROM loss), tbl.col) AS col FROM tbl`,
//! which relational reverse mode differentiates (see
//! [`crate::plan::reverse`]), so both forms share one engine.
//!
//! ```sql
//! WITH s AS (SELECT sum(d.x * p.val * p.val) AS loss FROM d JOIN p ON p.g = d.g)
//! SELECT g, val AS gradient FROM grad(s, p.val);
//! ```

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::error::Result;
use datafusion::functions_aggregate::expr_fn::sum;
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
#[derive(Debug, Default)]
pub struct GradRelation;

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
        let loss_plan = context
            .plan(table_named(loss))
            .map_err(|e| unresolved(e, loss))?;
        let table_plan = context
            .plan(table_named(table))
            .map_err(|e| unresolved(e, table))?;
        let column = context.normalize_ident(column.clone());
        let value = Expr::Column(loss_plan.schema().columns()[0].clone());
        let summed = LogicalPlanBuilder::from(loss_plan)
            .aggregate(Vec::<Expr>::new(), vec![sum(value)])?
            .build()?;
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
                            subquery: Arc::new(summed.clone()),
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

/// The table factor naming the relation `parts`.
fn table_named(parts: &[ast::Ident]) -> TableFactor {
    TableFactor::Table {
        name: ObjectName(
            parts
                .iter()
                .cloned()
                .map(ObjectNamePart::Identifier)
                .collect(),
        ),
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

/// `err` (planning the relation `parts`), explained where DataFusion did
/// not resolve it: DataFusion 55 resolves the tables and views of a
/// statement before planning it, from its FROM clauses, and the arguments of
/// a table function are not among them.
fn unresolved(err: DataFusionError, parts: &[ast::Ident]) -> DataFusionError {
    let name = ObjectName(
        parts
            .iter()
            .cloned()
            .map(ObjectNamePart::Identifier)
            .collect(),
    );
    if !err.to_string().contains("not found") {
        return err;
    }
    GradError::new(
        ErrorKind::NeedsPlanContext,
        format!(
            "`{name}` in grad(…) in FROM is not a CTE of the statement, and DataFusion 55 only \
             resolves the tables and views that a statement's FROM clauses name; name it in a \
             CTE: WITH {alias} AS (SELECT * FROM {name}) … grad({alias}, …), or use the scalar \
             form SELECT …, grad((SELECT loss FROM {name}), tbl.col) FROM tbl",
            alias = format!(
                "{}_",
                parts.last().map_or("r".to_string(), |i| i.value.clone())
            )
        ),
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
