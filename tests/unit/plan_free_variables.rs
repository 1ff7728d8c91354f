//! Unit tests of `src/plan/free_variables.rs`: outer references and
//! parameters localized as columns.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::expr::Placeholder as Parameter;
use datafusion::logical_expr::{col, lit, Expr};
use datafusion_grad::engine::call::MarkerKind;
use datafusion_grad::error::{ErrorKind, GradError};
use datafusion_grad::plan::free_variables::localize;
use datafusion_grad::reserved::outer_qualifier;

/// The schema of `g(w)`, the rows a subquery ranges over.
fn rows() -> DFSchema {
    let schema = Schema::new(vec![Field::new("w", DataType::Float64, false)]);
    DFSchema::try_from_qualified_schema("g", &schema).unwrap()
}

fn outer_x() -> Expr {
    Expr::OuterReferenceColumn(
        Arc::new(Field::new("x", DataType::Float64, false)),
        Column::new(Some("t"), "x"),
    )
}

fn parameter(field: Option<Field>) -> Expr {
    Expr::Placeholder(Parameter::new_with_field(
        "$1".to_string(),
        field.map(Arc::new),
    ))
}

#[test]
fn an_outer_reference_becomes_a_column_and_comes_back() {
    let x = outer_x();
    let f = col("g.w") * x.clone() * x.clone();
    let args = [f.clone(), x.clone()];
    let local = localize(MarkerKind::Grad, &args, &rows()).unwrap().unwrap();
    let placeholder = Column::new(Some(outer_qualifier(0)), "x");
    assert_eq!(local.args[1], Expr::Column(placeholder.clone()));
    assert!(local.schema.has_column(&placeholder));
    assert!(local.schema.has_column(&Column::new(Some("g"), "w")));
    assert_eq!(local.restore(local.args[0].clone()).unwrap(), f);
}

#[test]
fn a_parameter_is_localized_once() {
    let p = parameter(Some(Field::new("$1", DataType::Float64, true)));
    // jvp(f, $1, 1.0, $1, 2.0) is refused elsewhere; here both places
    // are the same variable, one placeholder.
    let f = col("g.w") * p.clone();
    let args = [f, p.clone(), lit(1.0)];
    let local = localize(MarkerKind::Jvp, &args, &rows()).unwrap().unwrap();
    assert_eq!(local.schema.fields().len(), 2);
    assert_eq!(local.restore(local.args[1].clone()).unwrap(), p);
}

#[test]
fn columns_alone_need_no_localizing() {
    let args = [col("g.w") * col("g.w"), col("g.w")];
    assert!(localize(MarkerKind::Grad, &args, &rows())
        .unwrap()
        .is_none());
}

#[test]
fn a_parameter_of_unknown_type_is_refused() {
    let p = parameter(None);
    let args = [col("g.w") * p.clone(), p];
    let Err(err) = localize(MarkerKind::Grad, &args, &rows()) else {
        panic!("a parameter of unknown type is localized")
    };
    let kind = GradError::find(&err).map(|g| g.kind());
    assert_eq!(kind, Some(ErrorKind::InvalidWrt), "{err}");
    assert!(err.to_string().contains("PREPARE q(DOUBLE)"), "{err}");
}
