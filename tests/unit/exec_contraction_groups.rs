//! Unit tests of `src/exec/contraction/groups.rs`: the sums of a
//! contraction's groups, in both layouts.

use datafusion::arrow::array::{Array, Float64Array};
use datafusion_grad::exec::contraction::groups::{Groups, DENSE_SLACK};

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
        let mut out = groups.take();
        let mut rows: Vec<(u32, u32, Option<f64>, Option<f64>)> = (0..out.probe.len())
            .map(|i| {
                let v = |s: &Float64Array| s.is_valid(i).then(|| s.value(i));
                (
                    out.probe.value(i),
                    out.build.value(i),
                    v(&out.sums[0]),
                    v(&out.sums[1]),
                )
            })
            .collect();
        rows.sort_by_key(|r| (r.0, r.1));
        assert_eq!(rows, [(0, 2, None, Some(4.0)), (2, 1, Some(3.5), None)]);
        assert!(groups.is_empty());
        out = groups.take();
        assert_eq!(out.probe.len(), 0);
    }
}
