//! Unit tests of `src/exec/contraction/numbering.rs`: numbers for the
//! distinct values of key columns.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Int32Array, Int64Array, StringArray};
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

#[test]
fn several_integer_columns_are_numbered_by_their_tuples() {
    let a: ArrayRef = Arc::new(Int32Array::from(vec![
        Some(1),
        Some(1),
        Some(1),
        None,
        Some(2),
        None,
        Some(1),
        Some(0),
    ]));
    let b: ArrayRef = Arc::new(Int64Array::from(vec![
        Some(5),
        Some(5),
        Some(6),
        Some(5),
        Some(5),
        Some(5),
        Some(5),
        None,
    ]));
    let columns = [Arc::clone(&a), Arc::clone(&b)];
    let types = [DataType::Int32, DataType::Int64];
    let mut keys = Numbering::new(&types, Nulls::Unmatched).unwrap();
    let mut out = vec![];
    keys.number(&columns, &mut out).unwrap();
    assert_eq!(out, [0, 0, 1, NONE, 2, NONE, 0, NONE]);
    // NULL in one column is not 0 in it: (NULL, 5) and (0, NULL) differ
    // from each other and from (0, 5)
    let mut groups = Numbering::new(&types, Nulls::Grouped).unwrap();
    groups.number(&columns, &mut out).unwrap();
    assert_eq!(out, [0, 0, 1, 2, 3, 2, 0, 4]);
    let values = groups.values().unwrap();
    assert_eq!(
        values[0].as_ref(),
        &Int32Array::from(vec![Some(1), Some(1), None, Some(2), Some(0)]) as &dyn Array
    );
    assert_eq!(
        values[1].as_ref(),
        &Int64Array::from(vec![Some(5), Some(6), Some(5), Some(5), None]) as &dyn Array
    );
    let probe = [
        Arc::new(Int32Array::from(vec![Some(2), Some(0), None, Some(1)])) as ArrayRef,
        Arc::new(Int64Array::from(vec![Some(5), Some(5), Some(5), Some(6)])) as ArrayRef,
    ];
    keys.find(&probe, &mut out).unwrap();
    assert_eq!(out, [2, NONE, NONE, 1]);
    groups.find(&probe, &mut out).unwrap();
    assert_eq!(out, [3, NONE, 2, 1]);
    // frozen: the keys (no NULLs) are found in a grid of their values, the
    // groups (with NULLs) as before; values outside the grid have none
    keys.freeze();
    groups.freeze();
    keys.find(&probe, &mut out).unwrap();
    assert_eq!(out, [2, NONE, NONE, 1]);
    groups.find(&probe, &mut out).unwrap();
    assert_eq!(out, [3, NONE, 2, 1]);
    let outside = [
        Arc::new(Int32Array::from(vec![3, 1, 2, 1])) as ArrayRef,
        Arc::new(Int64Array::from(vec![5, 4, 6, 7])) as ArrayRef,
    ];
    keys.find(&outside, &mut out).unwrap();
    assert_eq!(out, [NONE, NONE, NONE, NONE]);
}

/// Small non-negative integers go to a vector indexed by value, grown as
/// more values come (moving the values it then covers out of the hash
/// table), the rest to the hash table: the numbers are the first-seen
/// order's either way, before and after freezing, over many batches.
#[test]
fn integers_in_and_out_of_the_slots_keep_first_seen_numbers() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(47);
    for case in 0..40 {
        let mut grouped = Numbering::new(&[DataType::Int64], Nulls::Grouped).unwrap();
        let mut expected: std::collections::HashMap<Option<i64>, u32> = Default::default();
        let mut first_seen = vec![];
        // wide values first in some cases: a later growth must move them
        let wide = [10_000, 5_000_000, i64::MAX][case % 3];
        for _ in 0..rng.random_range(1..6) {
            let values: Vec<Option<i64>> = (0..rng.random_range(0..400))
                .map(|_| match rng.random_range(0..10) {
                    0 => None,
                    1 => Some(-rng.random_range(1..1000)),
                    2 => Some(rng.random_range(0..wide)),
                    _ => Some(rng.random_range(0..3000)),
                })
                .collect();
            let want: Vec<u32> = (values.iter())
                .map(|v| {
                    let next = expected.len() as u32;
                    *expected.entry(*v).or_insert_with(|| {
                        first_seen.push(*v);
                        next
                    })
                })
                .collect();
            let column: ArrayRef = Arc::new(Int64Array::from(values));
            assert_eq!(numbers(&mut grouped, column), want, "case {case}");
        }
        let values = grouped.values().unwrap();
        assert_eq!(
            values[0].as_ref(),
            &Int64Array::from(first_seen.clone()) as &dyn Array
        );
        let probe: Vec<Option<i64>> = (0..500)
            .map(|_| match rng.random_range(0..3) {
                0 => first_seen[rng.random_range(0..first_seen.len())],
                1 => Some(rng.random_range(-2000..6000)),
                _ => Some(rng.random_range(0..wide)),
            })
            .collect();
        let want: Vec<u32> = (probe.iter())
            .map(|v| expected.get(v).copied().unwrap_or(NONE))
            .collect();
        let probe: ArrayRef = Arc::new(Int64Array::from(probe));
        let mut out = vec![];
        grouped.find(&[Arc::clone(&probe)], &mut out).unwrap();
        assert_eq!(out, want, "case {case}");
        grouped.freeze();
        grouped.find(&[probe], &mut out).unwrap();
        assert_eq!(out, want, "case {case} frozen");
    }
}
