//! Unit tests of `src/tensor/kernels/`: both paths of every kernel against
//! naive loops: each test runs once on the dispatched path and once with the
//! portable path forced.

use datafusion_grad::tensor::construct::random_values;
use datafusion_grad::tensor::kernels::gemm::{APanel, MR, NR};
use datafusion_grad::tensor::kernels::*;

/// Runs `f` on the dispatched path and again with the portable path forced.
fn both_paths(f: impl Fn()) {
    f();
    FORCE_PORTABLE.with(|p| p.set(true));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            FORCE_PORTABLE.with(|p| p.set(false));
        }
    }
    let _reset = Reset;
    assert_eq!(isa(), "portable");
    f();
}

const SIZES: &[usize] = &[0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 67, 129, 257, 1000];

fn close(x: f64, y: f64, scale: f64) -> bool {
    (x - y).abs() <= 1e-12 * scale.max(1.0)
}

#[test]
fn isa_is_reported() {
    let isa = isa();
    assert!(isa == "avx2+fma" || isa == "portable");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        assert_eq!(isa, "avx2+fma");
    }
}

#[test]
fn binary_ops_match_naive() {
    both_paths(|| {
        for &n in SIZES {
            let (a, b) = (random_values(1.0, n), random_values(2.0, n));
            let b: Vec<f64> = b.iter().map(|v| v + 2.0).collect();
            type Binary = fn(&[f64], &[f64], &mut [f64]);
            type Naive = fn(f64, f64) -> f64;
            let cases: [(Binary, Naive); 4] = [
                (add, |x, y| x + y),
                (sub, |x, y| x - y),
                (mul, |x, y| x * y),
                (div, |x, y| x / y),
            ];
            for (kernel, naive) in cases {
                let mut out = vec![f64::NAN; n];
                kernel(&a, &b, &mut out);
                for i in 0..n {
                    assert_eq!(out[i], naive(a[i], b[i]), "n={n} i={i}");
                }
            }
        }
    });
}

#[test]
fn unary_ops_match_naive() {
    both_paths(|| {
        for &n in SIZES {
            let a = random_values(3.0, n);
            let mut out = vec![f64::NAN; n];
            scale(&a, -2.5, &mut out);
            assert!(out.iter().zip(&a).all(|(o, x)| *o == x * -2.5));
            add_scalar(&a, 0.75, &mut out);
            assert!(out.iter().zip(&a).all(|(o, x)| *o == x + 0.75));
            relu(&a, &mut out);
            assert!(out.iter().zip(&a).all(|(o, x)| *o == x.max(0.0)));
            map(&a, &mut out, f64::exp);
            assert!(out.iter().zip(&a).all(|(o, x)| *o == x.exp()));
            let mut y = random_values(4.0, n);
            let y0 = y.clone();
            axpy(0.3, &a, &mut y);
            for i in 0..n {
                assert!(close(y[i], y0[i] + 0.3 * a[i], 1.0), "axpy n={n} i={i}");
            }
        }
    });
}

#[test]
fn streaming_stores_on_large_outputs() {
    // Above the non-temporal threshold, with an output slice that starts
    // off 32-byte alignment, so the scalar head, stream body and tail run.
    both_paths(|| {
        let n = (2 << 20) + 37;
        let (a, b) = (random_values(5.0, n + 1), random_values(6.0, n + 1));
        let mut out = vec![0.0; n + 1];
        add(&a[1..], &b[1..], &mut out[1..]);
        assert!((1..=n).all(|i| out[i] == a[i] + b[i]));
        scale(&a[1..], 3.0, &mut out[1..]);
        assert!((1..=n).all(|i| out[i] == a[i] * 3.0));
        relu(&a[..n], &mut out[1..]);
        assert!((0..n).all(|i| out[i + 1] == a[i].max(0.0)));
    });
}

#[test]
fn relu_keeps_nan() {
    both_paths(|| {
        for &n in SIZES.iter().filter(|&&n| n > 0) {
            let mut a = random_values(7.0, n);
            a[n / 2] = f64::NAN;
            let mut out = vec![0.0; n];
            relu(&a, &mut out);
            for i in 0..n {
                if i == n / 2 {
                    assert!(out[i].is_nan());
                } else {
                    assert_eq!(out[i], a[i].max(0.0));
                }
            }
        }
    });
}

#[test]
fn reductions_match_naive() {
    both_paths(|| {
        for &n in SIZES {
            let (a, b) = (random_values(8.0, n), random_values(9.0, n));
            let naive_dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            let abs_dot: f64 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
            assert!(close(dot(&a, &b), naive_dot, abs_dot), "dot n={n}");
            let naive_sum: f64 = a.iter().sum();
            let abs_sum: f64 = a.iter().map(|x| x.abs()).sum();
            assert!(close(sum(&a), naive_sum, abs_sum), "sum n={n}");
            let naive_max = a.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
            assert_eq!(max(&a), naive_max, "max n={n}");
        }
        assert_eq!(sum(&[]), 0.0);
        assert_eq!(dot(&[], &[]), 0.0);
        assert_eq!(max(&[]), f64::NEG_INFINITY);
        assert_eq!(max(&[f64::NEG_INFINITY]), f64::NEG_INFINITY);
    });
}

#[test]
fn max_propagates_nan_anywhere() {
    both_paths(|| {
        for &n in SIZES.iter().filter(|&&n| n > 0) {
            for pos in [0, n / 2, n - 1] {
                let mut a = random_values(10.0, n);
                a[pos] = f64::NAN;
                assert!(max(&a).is_nan(), "n={n} pos={pos}");
            }
        }
    });
}

#[test]
fn transpose_outer_matvec_match_naive() {
    both_paths(|| {
        for &(r, c) in &[
            (0, 0),
            (0, 3),
            (1, 1),
            (3, 7),
            (33, 67),
            (129, 8),
            (64, 257),
        ] {
            let a = random_values(11.0, r * c);
            let mut t = vec![f64::NAN; r * c];
            transpose(r, c, &a, &mut t);
            for i in 0..r {
                for j in 0..c {
                    assert_eq!(t[j * r + i], a[i * c + j]);
                }
            }
            let (u, v) = (random_values(12.0, r), random_values(13.0, c));
            let mut o = vec![f64::NAN; r * c];
            outer(&u, &v, &mut o);
            for i in 0..r {
                for j in 0..c {
                    assert_eq!(o[i * c + j], u[i] * v[j]);
                }
            }
            let mut y = vec![f64::NAN; r];
            matvec(r, c, &a, &v, &mut y);
            for i in 0..r {
                let row = &a[i * c..(i + 1) * c];
                let naive: f64 = row.iter().zip(&v).map(|(x, y)| x * y).sum();
                let abs: f64 = row.iter().zip(&v).map(|(x, y)| (x * y).abs()).sum();
                assert!(close(y[i], naive, abs), "matvec {r}x{c} row {i}");
            }
        }
    });
}

/// Naive C = op(A)·op(B) with the layouts of `gemm_any`, and the matching
/// sum of absolute products for the error bound.
#[allow(clippy::too_many_arguments)]
fn naive(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    at: bool,
    b: &[f64],
    bt: bool,
) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0.0; m * n];
    let mut abs = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let x = if at { a[p * m + i] } else { a[i * k + p] };
                let y = if bt { b[j * k + p] } else { b[p * n + j] };
                c[i * n + j] += x * y;
                abs[i * n + j] += (x * y).abs();
            }
        }
    }
    (c, abs)
}

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (0, 3, 4),
    (3, 0, 4),
    (3, 4, 0),
    (5, 3, 7),
    (1, 67, 33),
    (33, 1, 67),
    (6, 8, 1),
    (12, 16, 300),
    (64, 10, 784),
    (130, 67, 33),
    (97, 129, 257),
    (257, 20, 513),
    (7, 2100, 40),
    (67, 300, 45),
];

#[test]
fn gemm_variants_match_naive() {
    both_paths(|| {
        for &(m, n, k) in SHAPES {
            let (a, b) = (random_values(14.0, m * k), random_values(15.0, k * n));
            let c0 = random_values(16.0, m * n);
            type Gemm = fn(usize, usize, usize, &[f64], &[f64], &mut [f64], bool);
            let variants: [(&str, Gemm, bool, bool); 3] = [
                ("gemm", gemm, false, false),
                ("gemm_tn", gemm_tn, true, false),
                ("gemm_nt", gemm_nt, false, true),
            ];
            for (name, f, at, bt) in variants {
                let (want, abs) = naive(m, n, k, &a, at, &b, bt);
                for accumulate in [false, true] {
                    let mut c = if accumulate {
                        c0.clone()
                    } else {
                        vec![f64::NAN; m * n]
                    };
                    f(m, n, k, &a, &b, &mut c, accumulate);
                    for i in 0..m * n {
                        let w = if accumulate { want[i] + c0[i] } else { want[i] };
                        assert!(
                            close(c[i], w, abs[i] + c0[i].abs()),
                            "{name} {m}x{n}x{k} acc={accumulate} i={i}: {} vs {w}",
                            c[i]
                        );
                    }
                }
            }
        }
    });
}

#[test]
fn gemm_edge_tiles_leave_neighbours_alone() {
    // A product written into the middle of nothing but its own slice:
    // check the blocked path never writes outside C by surrounding it.
    both_paths(|| {
        let (m, n, k) = (37, 29, 70);
        let (a, b) = (random_values(17.0, m * k), random_values(18.0, k * n));
        let mut buf = vec![7.0; m * n + 16];
        gemm(m, n, k, &a, &b, &mut buf[8..8 + m * n], false);
        assert!(buf[..8].iter().chain(&buf[8 + m * n..]).all(|&v| v == 7.0));
    });
}

#[test]
fn portable_variants_directly() {
    let (a, b) = (random_values(19.0, 33), random_values(20.0, 33));
    let mut out = vec![0.0; 33];
    portable::add(&a, &b, &mut out);
    assert!(out
        .iter()
        .zip(a.iter().zip(&b))
        .all(|(o, (x, y))| *o == x + y));
    let naive: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    assert!(close(portable::dot(&a, &b), naive, 33.0));
    let mut tile = [0.0; MR * NR];
    let (pa, pb) = (random_values(21.0, 3 * MR), random_values(22.0, 3 * NR));
    let ap = APanel {
        ptr: pa.as_ptr(),
        rs: 1,
        cs: MR,
    };
    // SAFETY: the packed A panel holds 3*MR elements (rs = 1, cs = MR), the
    // B panel 3*NR, and the tile is a separate local MR×NR array (ldc = NR).
    unsafe { portable::kernel::<false>(3, ap, pb.as_ptr(), tile.as_mut_ptr(), NR, true) };
    for r in 0..MR {
        for j in 0..NR {
            let w: f64 = (0..3).map(|p| pa[p * MR + r] * pb[p * NR + j]).sum();
            assert!(close(tile[r * NR + j], w, 3.0));
        }
    }
}
