//! Unit tests of `src/engine/graph.rs`: splitting an expression into its
//! shell and children.

use datafusion::arrow::datatypes::DataType;
use datafusion::logical_expr::{col, lit, when, Case, Cast, Expr, TryCast};
use datafusion::prelude::sin;
use datafusion_grad::engine::graph::{split, split_ref};

#[test]
fn split_ref_matches_split() {
    let x = || col("x");
    let exprs = [
        sin(x() + lit(1.0)),
        Expr::Cast(Cast::new(Box::new(x()), DataType::Int64)),
        Expr::TryCast(TryCast::new(Box::new(x()), DataType::Int64)),
        !x().gt(lit(0.0)),
        x().is_null(),
        x().is_not_null(),
        when(x().gt(lit(0.0)), x())
            .otherwise(lit(0.0))
            .expect("valid CASE"),
        Expr::Case(Case::new(
            Some(Box::new(x())),
            vec![(Box::new(lit(1.0)), Box::new(x()))],
            None,
        )),
        x(),
        lit(2.0),
    ];
    for e in exprs {
        let mut children = Vec::new();
        let shell = split_ref(&e, &mut children).expect("a common kind of node");
        let (expected, owned) = split(e.clone()).expect("splits");
        assert_eq!(shell, expected);
        assert_eq!(children.into_iter().cloned().collect::<Vec<_>>(), owned);
    }
}
