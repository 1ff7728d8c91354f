//! Unit tests of `src/plan/reverse/block.rs`: which plans read the
//! parameter rows.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::logical_expr::logical_plan::builder::LogicalTableSource;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion_grad::error::{ErrorKind, GradError};
use datafusion_grad::plan::reverse::block::Blocks;

#[test]
fn a_different_scan_of_the_parameter_table_is_refused() {
    let schema = Schema::new(vec![
        Field::new("g", DataType::Int32, false),
        Field::new("val", DataType::Float64, false),
    ]);
    let source = Arc::new(LogicalTableSource::new(Arc::new(schema)));
    let scan = |projection| {
        LogicalPlanBuilder::scan("p", Arc::clone(&source) as _, projection)
            .unwrap()
            .build()
            .unwrap()
    };
    let parameter = scan(None);
    let blocks = Blocks::new(&parameter);
    assert!(blocks.reads(&scan(None)).unwrap());
    let err = blocks.reads(&scan(Some(vec![1]))).unwrap_err();
    let kind = GradError::find(&err).map(|e| e.kind());
    assert_eq!(kind, Some(ErrorKind::NeedsPlanContext), "{err}");
    assert!(err
        .to_string()
        .contains("scans the variable's table `p` differently"));
}
