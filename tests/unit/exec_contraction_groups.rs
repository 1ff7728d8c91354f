//! Unit tests of `src/exec/contraction/groups.rs`: the sums of a
//! contraction's groups, in both layouts.

use datafusion::arrow::array::{Array, Float64Array};
use datafusion_grad::exec::contraction::groups::{Emitted, Groups, DENSE_SLACK};

/// The emitted groups of two sums: probe and build numbers, each sum
/// (`None`: NULL).
fn rows(out: &Emitted) -> Vec<(u32, u32, Option<f64>, Option<f64>)> {
    (0..out.probe.len())
        .map(|i| {
            let v = |s: &Float64Array| s.is_valid(i).then(|| s.value(i));
            (
                out.probe.value(i),
                out.build.value(i),
                v(&out.sums[0]),
                v(&out.sums[1]),
            )
        })
        .collect()
}

/// The same pairs and sums in both layouts: only groups met, NULL where
/// no non-NULL product came.
#[test]
fn both_layouts_keep_the_groups_met() {
    for width in [3, DENSE_SLACK + 1] {
        let mut groups = Groups::new(width, 2);
        let a = groups.place(2, 1);
        groups.add(a, 0, 1.5);
        let b = groups.place(0, 2);
        groups.add(b, 1, 4.0);
        let a2 = groups.place(2, 1);
        assert_eq!(a, a2);
        groups.add(a2, 0, 2.0);
        let mut rows = rows(&groups.take());
        rows.sort_by_key(|r| (r.0, r.1));
        assert_eq!(rows, [(0, 2, None, Some(4.0)), (2, 1, Some(3.5), None)]);
        assert!(groups.is_empty());
        assert_eq!(groups.take().probe.len(), 0);
    }
}

/// A probe group's row of sums (one per build group, side by side): every
/// group of the row is met, reached by a non-NULL product, and shares its
/// sums with `place`; once the groups are hashed, no row is given.
#[test]
fn a_row_of_sums_is_its_groups_side_by_side() {
    let mut groups = Groups::new(3, 2);
    let row = groups.row(1).expect("the dense layout gives rows");
    assert_eq!(row.len(), 6);
    for (i, s) in row.iter_mut().enumerate() {
        *s += i as f64;
    }
    let place = groups.place(1, 2);
    groups.add(place, 1, 10.0);
    let row = groups.row(1).expect("the dense layout gives rows");
    assert_eq!(row, [0.0, 1.0, 2.0, 3.0, 4.0, 15.0]);
    let other = groups.place(0, 0);
    groups.add(other, 0, 7.0);
    assert_eq!(
        rows(&groups.take()),
        [
            (0, 0, Some(7.0), None),
            (1, 0, Some(0.0), Some(1.0)),
            (1, 1, Some(2.0), Some(3.0)),
            (1, 2, Some(4.0), Some(15.0)),
        ]
    );
    // A row far beyond the groups met: the groups move to a hash table.
    let mut groups = Groups::new(DENSE_SLACK + 1, 1);
    assert!(groups.row(4).is_none());
    let place = groups.place(4, 0);
    groups.add(place, 0, 1.0);
    assert_eq!(groups.take().probe.len(), 1);
}

/// Every place of the side-by-side layout a group (a dense product's
/// sums): emitted in the order of their places as before, NULL where no
/// non-NULL product came — with one sum and with two.
#[test]
fn a_full_grid_of_groups_is_emitted_in_order() {
    let mut groups = Groups::new(2, 1);
    let p = groups.place(1, 1);
    groups.add(p, 0, 2.5);
    groups.row(0).expect("the dense layout gives rows")[1] += 4.0;
    // (1, 0) met, but by no non-NULL product
    groups.place(1, 0);
    let out = groups.take();
    let sums = &out.sums[0];
    let got: Vec<_> = (0..out.probe.len())
        .map(|i| {
            let sum = sums.is_valid(i).then(|| sums.value(i));
            (out.probe.value(i), out.build.value(i), sum)
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, 0, Some(0.0)),
            (0, 1, Some(4.0)),
            (1, 0, None),
            (1, 1, Some(2.5))
        ]
    );
    assert!(groups.is_empty());
    // Used again after the sums were given: a fresh grid.
    let p = groups.place(0, 1);
    groups.add(p, 0, 1.0);
    assert_eq!(groups.take().sums[0].len(), 1);

    let mut groups = Groups::new(2, 2);
    groups.row(0).expect("the dense layout gives rows")[3] = 5.0;
    let p = groups.place(1, 0);
    groups.add(p, 1, 6.0);
    groups.place(1, 1);
    assert_eq!(
        rows(&groups.take()),
        [
            (0, 0, Some(0.0), Some(0.0)),
            (0, 1, Some(0.0), Some(5.0)),
            (1, 0, None, Some(6.0)),
            (1, 1, None, None),
        ]
    );
}
