//! Unit tests of `src/exec/contraction/numbering.rs`: numbers for the
//! distinct values of key columns.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Int32Array, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion_grad::exec::contraction::numbering::{Nulls, Numbering, NONE};

fn numbers(n: &mut Numbering, column: ArrayRef) -> Vec<u32> {
    let mut out = vec![];
    n.number(&[column], &mut out).unwrap();
    out
}

#[test]
fn integers_are_numbered_in_first_seen_order_and_nulls_as_asked() {
    let column: ArrayRef = Arc::new(Int32Array::from(vec![
        Some(7),
        None,
        Some(-3),
        Some(7),
        None,
    ]));
    let mut keys = Numbering::new(&[DataType::Int32], Nulls::Unmatched).unwrap();
    assert_eq!(
        numbers(&mut keys, Arc::clone(&column)),
        [0, NONE, 1, 0, NONE]
    );
    let mut groups = Numbering::new(&[DataType::Int32], Nulls::Grouped).unwrap();
    assert_eq!(numbers(&mut groups, Arc::clone(&column)), [0, 1, 2, 0, 1]);
    let values = groups.values().unwrap();
    assert_eq!(
        values[0].as_ref(),
        &Int32Array::from(vec![Some(7), None, Some(-3)]) as &dyn Array
    );
    // frozen: found directly, unknown values and NULLs have no number
    keys.freeze();
    let probe: ArrayRef = Arc::new(Int32Array::from(vec![Some(-3), Some(8), None, Some(7)]));
    let mut out = vec![];
    keys.find(&[probe], &mut out).unwrap();
    assert_eq!(out, [1, NONE, NONE, 0]);
}

#[test]
fn strings_and_several_columns_go_by_their_row_encoding() {
    let a: ArrayRef = Arc::new(StringArray::from(vec![
        Some("a"),
        Some("b"),
        None,
        Some("a"),
    ]));
    let b: ArrayRef = Arc::new(Int32Array::from(vec![1, 1, 1, 2]));
    let mut keys = Numbering::new(&[DataType::Utf8, DataType::Int32], Nulls::Unmatched).unwrap();
    let mut out = vec![];
    keys.number(&[Arc::clone(&a), Arc::clone(&b)], &mut out)
        .unwrap();
    assert_eq!(out, [0, 1, NONE, 2]);
    keys.find(&[a, b], &mut out).unwrap();
    assert_eq!(out, [0, 1, NONE, 2]);
    assert_eq!(keys.values().unwrap()[0].len(), 3);
}
