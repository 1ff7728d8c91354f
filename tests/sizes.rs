//! Derivative sizes, the figures `benches/rewrite.rs` prints, asserted: the
//! derivative DAG of every family stays within a constant factor of `f`'s
//! (reverse mode with shared subexpressions: no expression swell), and the
//! factor does not grow with the size.

use datafusion_grad::Rules;

use crate::common::on_big_stack;
use crate::families::{dag_sizes, mlp, nested, product, Case};

/// Derivative DAG nodes over forward DAG nodes.
fn ratio(case: &Case) -> f64 {
    let (forward, derivative) = dag_sizes(case, &Rules::builtin());
    derivative as f64 / forward as f64
}

#[test]
fn derivatives_stay_linear_in_the_forward_size() {
    on_big_stack(256 << 20, || {
        let families: [(&str, Vec<Case>); 3] = [
            ("product", vec![product(10), product(100), product(1000)]),
            ("nested", vec![nested(10), nested(100), nested(300)]),
            ("mlp", vec![mlp(2, 4), mlp(4, 8), mlp(16, 32)]),
        ];
        for (family, cases) in families {
            let ratios: Vec<f64> = cases.iter().map(ratio).collect();
            // All n partials of an n-ary product: 2 nodes per factor (its
            // prefix and suffix products), at most 5x the forward DAG.
            assert!(
                ratios.iter().all(|&r| r <= 5.0),
                "{family}: derivative/forward ratios {ratios:?} (limit 5)"
            );
            let (small, large) = (ratios[1], ratios[2]);
            assert!(
                large <= small * 1.1 + 0.1,
                "{family}: the ratio grows with the size: {ratios:?}"
            );
        }
    });
}
