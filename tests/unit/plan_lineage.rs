//! Unit tests of `src/plan/lineage.rs`: derived columns inlined, identities
//! through projections, aggregate outputs.

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::Column;
use datafusion::functions_aggregate::expr_fn::avg;
use datafusion::logical_expr::{col, lit, table_scan, LogicalPlan, LogicalPlanBuilder};
use datafusion_grad::error::{ErrorKind, GradError};
use datafusion_grad::plan::lineage::Scope;
use datafusion_grad::reserved::Placeholder;

/// `t(x, y)` under `SELECT t.x, t.y, t.x * 2 AS z, t.y + 1 AS u`.
fn derived() -> LogicalPlan {
    let schema = Schema::new(vec![
        Field::new("x", DataType::Float64, false),
        Field::new("y", DataType::Float64, false),
    ]);
    table_scan(Some("t"), &schema, None)
        .unwrap()
        .project(vec![
            col("t.x"),
            col("t.y"),
            (col("t.x") * lit(2.0)).alias("z"),
            (col("t.y") + lit(1.0)).alias("u"),
        ])
        .unwrap()
        .build()
        .unwrap()
}

#[test]
fn derived_columns_of_the_variable_are_inlined() {
    let plan = derived();
    let scope = Scope::new(vec![&plan]).unwrap();
    let x = Column::new(Some("t"), "x");
    let inlined = scope.inline(col("z") * col("z"), &[x], &[]).unwrap();
    assert!(inlined.transformed);
    let twice = col("t.x") * lit(2.0);
    assert_eq!(inlined.data, twice.clone() * twice);
    // `u` does not depend on x: it stays a column.
    let x = Column::new(Some("t"), "x");
    let kept = scope.inline(col("u") * col("t.x"), &[x], &[]).unwrap();
    assert!(!kept.transformed);
    assert_eq!(kept.data, col("u") * col("t.x"));
}

#[test]
fn the_variable_has_one_identity_through_projections() {
    let plan = derived();
    let above = LogicalPlanBuilder::from(plan.clone())
        .project(vec![col("x").alias("x2"), col("z")])
        .unwrap()
        .build()
        .unwrap();
    let below = Scope::new(vec![&plan]).unwrap();
    let top = Scope::new(vec![&above]).unwrap();
    let x = below.identity(&Column::new(Some("t"), "x")).unwrap();
    assert!(x.is_some());
    assert_eq!(top.identity(&Column::from_name("x2")).unwrap(), x);
    // A computed column has an identity of its own.
    assert_ne!(below.identity(&Column::from_name("z")).unwrap(), x);
}

#[test]
fn an_aggregate_output_is_refused_or_recorded() {
    let plan = LogicalPlanBuilder::from(derived())
        .aggregate(
            vec![col("t.y")],
            vec![avg(col("z") * col("t.y")).alias("m")],
        )
        .unwrap()
        .build()
        .unwrap();
    let scope = Scope::new(vec![&plan]).unwrap();
    let y = Column::new(Some("t"), "y");
    let err = scope
        .inline(col("m"), std::slice::from_ref(&y), &[])
        .unwrap_err();
    let kind = GradError::find(&err).map(|g| g.kind());
    assert_eq!(kind, Some(ErrorKind::NeedsPlanContext), "{err}");
    let (f, refs) = scope
        .inline_through_aggregates(col("m"), &[y], &[])
        .unwrap();
    assert_eq!(f, Placeholder::Aggregate.column(0));
    assert_eq!(refs.len(), 1);
}
