//! Variables that are outer references: a marker inside a subquery that
//! differentiates with respect to a column of the outer query.
//!
//! ```sql
//! -- d/dx avg(g.w · x) = avg(g.w), for every row of t
//! SELECT t.x, (SELECT avg(grad(g.w * t.x, t.x)) FROM g) FROM t;
//! SELECT t.x, (SELECT grad(avg(g.w * t.x), t.x) FROM g) FROM t;
//! ```
//!
//! Inside the subquery `t.x` is an `OuterReferenceColumn`, constant over the
//! subquery's rows (and so within each of its groups). The engine works over
//! a schema's columns, so each such variable is *localized*: replaced by a
//! placeholder column (qualified `__dfgrad_outer{k}`, with the outer column's
//! name and type) added to the schema, differentiated like any column, and
//! put back as the outer reference in the result. Whether DataFusion can then
//! run the subquery depends on the result: `avg(g.w)` above is uncorrelated,
//! `avg(2 · g.w · t.x)` is not (see [`crate::subqueries`]).

use std::sync::Arc;

use datafusion::arrow::datatypes::FieldRef;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;

use crate::marker::{as_marker, MarkerKind};

/// A marker call's arguments with its outer-reference variables replaced by
/// placeholder columns, and the schema that has them.
pub(crate) struct Localized {
    /// The arguments, over [`Localized::schema`].
    pub args: Vec<Expr>,
    /// The schema extended with one field per placeholder.
    pub schema: DFSchema,
    /// Each placeholder and the outer reference it stands for.
    outer: Vec<(Column, FieldRef, Column)>,
}

/// The outer columns a marker call of `kind` differentiates with respect to.
pub(crate) fn outer_variables(kind: MarkerKind, args: &[Expr]) -> Vec<Column> {
    kind.wrt_positions(args.len())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| match args.get(p) {
            Some(Expr::OuterReferenceColumn(_, c)) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

/// Whether `e` holds a marker call with an outer-reference variable.
pub(crate) fn has_outer_variable(e: &Expr) -> bool {
    e.exists(|e| {
        Ok(match (as_marker(e), e) {
            (Some(m), Expr::ScalarFunction(call)) => {
                !outer_variables(m.kind(), &call.args).is_empty()
            }
            _ => false,
        })
    })
    .unwrap_or(false)
}

/// `args` of a marker call of `kind` localized over `schema`; `None` when no
/// variable is an outer reference.
pub(crate) fn localize(
    kind: MarkerKind,
    args: &[Expr],
    schema: &DFSchema,
) -> Result<Option<Localized>> {
    let positions = kind.wrt_positions(args.len())?;
    let mut outer: Vec<(Column, FieldRef, Column)> = Vec::new();
    for p in positions {
        if let Expr::OuterReferenceColumn(field, c) = &args[p] {
            if !outer.iter().any(|(_, _, o)| o == c) {
                let qualifier = TableReference::bare(format!("__dfgrad_outer{}", outer.len()));
                let local = Column::new(Some(qualifier), c.name.clone());
                outer.push((local, Arc::clone(field), c.clone()));
            }
        }
    }
    if outer.is_empty() {
        return Ok(None);
    }
    let mut extended = schema.clone();
    for (local, field, _) in &outer {
        let field = field.as_ref().clone().with_name(local.name.clone());
        let one = DFSchema::try_from_qualified_schema(
            local.relation.clone().expect("qualified"),
            &datafusion::arrow::datatypes::Schema::new(vec![field]),
        )?;
        extended = extended.join(&one)?;
    }
    let args = args
        .iter()
        .map(|a| {
            a.clone()
                .transform_up(|e| match &e {
                    Expr::OuterReferenceColumn(_, c) => {
                        match outer.iter().find(|(_, _, o)| o == c) {
                            Some((local, _, _)) => {
                                Ok(Transformed::yes(Expr::Column(local.clone())))
                            }
                            None => Ok(Transformed::no(e)),
                        }
                    }
                    _ => Ok(Transformed::no(e)),
                })
                .map(|t| t.data)
        })
        .collect::<Result<_>>()?;
    Ok(Some(Localized {
        args,
        schema: extended,
        outer,
    }))
}

impl Localized {
    /// `e` (a derivative over [`Localized::schema`]) with the placeholders
    /// put back as the outer references they stand for.
    pub fn restore(&self, e: Expr) -> Result<Expr> {
        Ok(e.transform_up(|e| match &e {
            Expr::Column(c) => match self.outer.iter().find(|(local, _, _)| local == c) {
                Some((_, field, outer)) => Ok(Transformed::yes(Expr::OuterReferenceColumn(
                    Arc::clone(field),
                    outer.clone(),
                ))),
                None => Ok(Transformed::no(e)),
            },
            _ => Ok(Transformed::no(e)),
        })?
        .data)
    }
}
