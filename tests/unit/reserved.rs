//! Unit tests of `src/reserved.rs`: placeholder columns and bound names.

use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::Expr;
use datafusion_grad::reserved::{binding_prefix, is_bound_name, Placeholder};

#[test]
fn placeholders_round_trip() {
    for family in [Placeholder::Arg, Placeholder::Node, Placeholder::Acero] {
        let Expr::Column(c) = family.column(7) else {
            panic!("a column")
        };
        assert_eq!(family.index(&c), Some(7));
        assert_eq!(Placeholder::Root.index(&c), None);
    }
    let qualified = Column::new(Some("t"), Placeholder::Node.name(1));
    assert_eq!(Placeholder::Node.index(&qualified), None);
}

#[test]
fn bound_names() {
    let schema = DFSchema::empty();
    let prefix = binding_prefix(&schema);
    assert_eq!(prefix, "__dfgrad0_");
    assert!(is_bound_name(&format!("{prefix}15")));
    assert!(is_bound_name("__dfgrad12_root"));
    assert!(!is_bound_name(&Placeholder::AddedAggregate.name(0)));
    assert!(!is_bound_name("__dfgrad0_"));
    assert!(is_bound_name("__common_expr_1"));
    assert!(!is_bound_name("__common_expr_"));
}
