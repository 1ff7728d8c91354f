//! Unit tests of `src/engine/guard.rs`: guards, each atom tested once.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::DFSchema;
use datafusion::logical_expr::{col, lit, when};
use datafusion_grad::engine::Workspace;
use datafusion_grad::rules::Rules;

fn schema() -> DFSchema {
    let fields = vec![
        Field::new("x", DataType::Float64, true),
        Field::new("y", DataType::Float64, true),
    ];
    DFSchema::try_from(Arc::new(Schema::new(fields))).unwrap()
}

#[test]
fn an_atom_enters_a_guard_once() {
    let (schema, rules) = (schema(), Rules::builtin());
    let mut ws = Workspace::new(&schema, &rules);
    let a = ws.intern(&col("x").gt(lit(0.0))).unwrap();
    let b = ws.intern(&col("y").gt(lit(0.0))).unwrap();
    let ab = ws.guard_and(Some(a), b);
    assert_eq!(ws.atoms(ab), vec![a, b]);
    assert_eq!(ws.guard_and(Some(ab), a), ab);
    assert_eq!(ws.guard_and(Some(ab), ab), ab);
    assert_eq!(ws.guard_and(None, ab), ab);
    // a unit selection's test is its condition
    let indicator = ws
        .intern(&when(col("x").gt(lit(0.0)), lit(1.0)).end().unwrap())
        .unwrap();
    assert_eq!(ws.selected(indicator), a);
    assert!(ws.is_unit_selection(indicator));
    let on_branch = ws.selected(indicator);
    assert_eq!(ws.guard_and(Some(ab), on_branch), ab);
    // a disjunction is implied by either side, and a side that implies
    // the other is left out of it
    let either = ws.guard_or(&[a, ab]);
    assert_eq!(either, a);
    let either = ws.guard_or(&[ab, b, a]);
    assert!(ws.implies(&[a], either) && ws.implies(&[b], either));
    assert!(!ws.implies(&[], either));
}

#[test]
fn a_case_under_its_own_condition_is_its_branch() {
    let (schema, rules) = (schema(), Rules::builtin());
    let mut ws = Workspace::new(&schema, &rules);
    let a = ws.intern(&col("x").gt(lit(0.0))).unwrap();
    let b = ws.intern(&col("y").gt(lit(0.0))).unwrap();
    let e = ws.intern(&(col("x") * col("y"))).unwrap();
    let inner = ws.case_when(a, e, None);
    assert_eq!(ws.case_when(a, inner, None), ws.case_when(a, e, None));
    let ab = ws.guard_and(Some(a), b);
    let zero = ws.g.num(0.0);
    assert_eq!(
        ws.case_when(ab, inner, Some(zero)),
        ws.case_when(ab, e, Some(zero))
    );
    // not under a condition that does not imply it
    let under_b = ws.case_when(b, inner, None);
    assert_eq!(ws.g.args(under_b)[1], inner);
}
