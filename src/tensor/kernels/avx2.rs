//! Kernels compiled for AVX2+FMA (x86-64 only): `std::arch::x86_64`
//! intrinsics, with 4×-unrolled 256-bit loops for the streaming operations
//! (non-temporal stores once the output is far larger than the caches) and a
//! 6×8 register-blocked FMA micro-kernel for GEMM.
//!
//! # Safety
//!
//! Every function here is `#[target_feature(enable = "avx2,fma")]`: running
//! it on a CPU without AVX2 and FMA is undefined behaviour, so outside this
//! module it is unsafe to call, and its `# Safety` section says so. The
//! parent module calls these functions only behind the run-time check of
//! `use_avx2`. Inside, raw-pointer loads and stores are bounded by the slice
//! lengths (each `unsafe` block states the bound), except the GEMM
//! micro-kernel's, which the contract of [`kernel_6x8`] bounds.

use std::arch::x86_64::*;

use super::gemm::{APanel, MR, NR};

/// Output lengths from which the streaming kernels use non-temporal stores:
/// 16 MiB of output, so inputs plus output overflow the L3 anyway.
const STREAM_MIN_LEN: usize = 2 << 20;

/// `out[i] = f(a[i])` with a vector body `$vec` (binding `$x`) and a
/// scalar body `$sca` (binding `$s`) for the unaligned head and the tail.
/// Large outputs use non-temporal stores.
macro_rules! unary_loop {
    ($a:expr, $out:expr, |$x:ident| $vec:expr, |$s:ident| $sca:expr) => {{
        let a: &[f64] = $a;
        let out: &mut [f64] = $out;
        let n = out.len();
        assert_eq!(a.len(), n);
        let pa = a.as_ptr();
        let po = out.as_mut_ptr();
        let stream = n >= STREAM_MIN_LEN;
        let mut i = 0;
        if stream {
            while i < n && (po as usize + i * 8) % 32 != 0 {
                // SAFETY: i < n, the length of both slices.
                unsafe {
                    let $s = *pa.add(i);
                    *po.add(i) = $sca;
                }
                i += 1;
            }
        }
        while i + 16 <= n {
            // SAFETY: i + 16 <= n, the length of both slices; streaming
            // stores are only used once `po + i` is 32-byte aligned (the
            // head loop above, advancing by multiples of 4 keeps it so).
            unsafe {
                let r0 = {
                    let $x = _mm256_loadu_pd(pa.add(i));
                    $vec
                };
                let r1 = {
                    let $x = _mm256_loadu_pd(pa.add(i + 4));
                    $vec
                };
                let r2 = {
                    let $x = _mm256_loadu_pd(pa.add(i + 8));
                    $vec
                };
                let r3 = {
                    let $x = _mm256_loadu_pd(pa.add(i + 12));
                    $vec
                };
                if stream {
                    _mm256_stream_pd(po.add(i), r0);
                    _mm256_stream_pd(po.add(i + 4), r1);
                    _mm256_stream_pd(po.add(i + 8), r2);
                    _mm256_stream_pd(po.add(i + 12), r3);
                } else {
                    _mm256_storeu_pd(po.add(i), r0);
                    _mm256_storeu_pd(po.add(i + 4), r1);
                    _mm256_storeu_pd(po.add(i + 8), r2);
                    _mm256_storeu_pd(po.add(i + 12), r3);
                }
            }
            i += 16;
        }
        if stream {
            _mm_sfence();
        }
        while i + 4 <= n {
            // SAFETY: i + 4 <= n, the length of both slices.
            unsafe {
                let $x = _mm256_loadu_pd(pa.add(i));
                _mm256_storeu_pd(po.add(i), $vec);
            }
            i += 4;
        }
        while i < n {
            // SAFETY: i < n, the length of both slices.
            unsafe {
                let $s = *pa.add(i);
                *po.add(i) = $sca;
            }
            i += 1;
        }
    }};
}

/// `out[i] = f(a[i], b[i])`, as [`unary_loop`] with two inputs.
macro_rules! binary_loop {
    ($a:expr, $b:expr, $out:expr, |$x:ident, $y:ident| $vec:expr, |$s:ident, $t:ident| $sca:expr) => {{
        let a: &[f64] = $a;
        let b: &[f64] = $b;
        let out: &mut [f64] = $out;
        let n = out.len();
        assert!(a.len() == n && b.len() == n);
        let pa = a.as_ptr();
        let pb = b.as_ptr();
        let po = out.as_mut_ptr();
        let stream = n >= STREAM_MIN_LEN;
        let mut i = 0;
        if stream {
            while i < n && (po as usize + i * 8) % 32 != 0 {
                // SAFETY: i < n, the length of all three slices.
                unsafe {
                    let ($s, $t) = (*pa.add(i), *pb.add(i));
                    *po.add(i) = $sca;
                }
                i += 1;
            }
        }
        while i + 16 <= n {
            // SAFETY: i + 16 <= n, the length of all three slices;
            // streaming stores only once `po + i` is 32-byte aligned.
            unsafe {
                let r0 = {
                    let ($x, $y) = (_mm256_loadu_pd(pa.add(i)), _mm256_loadu_pd(pb.add(i)));
                    $vec
                };
                let r1 = {
                    let ($x, $y) = (
                        _mm256_loadu_pd(pa.add(i + 4)),
                        _mm256_loadu_pd(pb.add(i + 4)),
                    );
                    $vec
                };
                let r2 = {
                    let ($x, $y) = (
                        _mm256_loadu_pd(pa.add(i + 8)),
                        _mm256_loadu_pd(pb.add(i + 8)),
                    );
                    $vec
                };
                let r3 = {
                    let ($x, $y) = (
                        _mm256_loadu_pd(pa.add(i + 12)),
                        _mm256_loadu_pd(pb.add(i + 12)),
                    );
                    $vec
                };
                if stream {
                    _mm256_stream_pd(po.add(i), r0);
                    _mm256_stream_pd(po.add(i + 4), r1);
                    _mm256_stream_pd(po.add(i + 8), r2);
                    _mm256_stream_pd(po.add(i + 12), r3);
                } else {
                    _mm256_storeu_pd(po.add(i), r0);
                    _mm256_storeu_pd(po.add(i + 4), r1);
                    _mm256_storeu_pd(po.add(i + 8), r2);
                    _mm256_storeu_pd(po.add(i + 12), r3);
                }
            }
            i += 16;
        }
        if stream {
            _mm_sfence();
        }
        while i + 4 <= n {
            // SAFETY: i + 4 <= n, the length of all three slices.
            unsafe {
                let ($x, $y) = (_mm256_loadu_pd(pa.add(i)), _mm256_loadu_pd(pb.add(i)));
                _mm256_storeu_pd(po.add(i), $vec);
            }
            i += 4;
        }
        while i < n {
            // SAFETY: i < n, the length of all three slices.
            unsafe {
                let ($s, $t) = (*pa.add(i), *pb.add(i));
                *po.add(i) = $sca;
            }
            i += 1;
        }
    }};
}

/// `out = a + b`; panics unless the lengths are equal.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn add(a: &[f64], b: &[f64], out: &mut [f64]) {
    binary_loop!(a, b, out, |x, y| _mm256_add_pd(x, y), |x, y| x + y);
}

/// `out = a - b`; panics unless the lengths are equal.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn sub(a: &[f64], b: &[f64], out: &mut [f64]) {
    binary_loop!(a, b, out, |x, y| _mm256_sub_pd(x, y), |x, y| x - y);
}

/// `out = a * b`; panics unless the lengths are equal.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn mul(a: &[f64], b: &[f64], out: &mut [f64]) {
    binary_loop!(a, b, out, |x, y| _mm256_mul_pd(x, y), |x, y| x * y);
}

/// `out = a / b`; panics unless the lengths are equal.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn div(a: &[f64], b: &[f64], out: &mut [f64]) {
    binary_loop!(a, b, out, |x, y| _mm256_div_pd(x, y), |x, y| x / y);
}

/// `out = a * s`; panics unless the lengths are equal.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn scale(a: &[f64], s: f64, out: &mut [f64]) {
    let sv = _mm256_set1_pd(s);
    unary_loop!(a, out, |x| _mm256_mul_pd(x, sv), |x| x * s);
}

/// `out = a + s`; panics unless the lengths are equal.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn add_scalar(a: &[f64], s: f64, out: &mut [f64]) {
    let sv = _mm256_set1_pd(s);
    unary_loop!(a, out, |x| _mm256_add_pd(x, sv), |x| x + s);
}

/// `out = max(a, 0)`; panics unless the lengths are equal.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn relu(a: &[f64], out: &mut [f64]) {
    let zero = _mm256_setzero_pd();
    // `max_pd(0, x)` returns x when the comparison 0 > x is false, so
    // NaN (and -0.0) pass through.
    unary_loop!(a, out, |x| _mm256_max_pd(zero, x), |x| if x < 0.0 {
        0.0
    } else {
        x
    });
}

/// `y += alpha * x` with fused multiply-adds; panics unless the lengths
/// are equal.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn axpy(alpha: f64, x: &[f64], y: &mut [f64]) {
    let n = y.len();
    assert_eq!(x.len(), n);
    let av = _mm256_set1_pd(alpha);
    let (px, py) = (x.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n, the length of both slices.
        unsafe {
            for u in 0..4 {
                let o = i + 4 * u;
                let r = _mm256_fmadd_pd(av, _mm256_loadu_pd(px.add(o)), _mm256_loadu_pd(py.add(o)));
                _mm256_storeu_pd(py.add(o), r);
            }
        }
        i += 16;
    }
    while i + 4 <= n {
        // SAFETY: i + 4 <= n, the length of both slices.
        unsafe {
            let r = _mm256_fmadd_pd(av, _mm256_loadu_pd(px.add(i)), _mm256_loadu_pd(py.add(i)));
            _mm256_storeu_pd(py.add(i), r);
        }
        i += 4;
    }
    for (v, &u) in y[i..].iter_mut().zip(&x[i..]) {
        *v = alpha.mul_add(u, *v);
    }
}

/// Horizontal sum of the four lanes.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256d) -> f64 {
    let s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
    _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
}

/// The dot product, in four 4-lane accumulators; panics unless the lengths
/// are equal.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len();
    assert_eq!(b.len(), n);
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_pd(); 4];
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n, the length of both slices.
        unsafe {
            for (u, s) in acc.iter_mut().enumerate() {
                let o = i + 4 * u;
                *s = _mm256_fmadd_pd(_mm256_loadu_pd(pa.add(o)), _mm256_loadu_pd(pb.add(o)), *s);
            }
        }
        i += 16;
    }
    while i + 4 <= n {
        // SAFETY: i + 4 <= n, the length of both slices.
        unsafe {
            acc[0] = _mm256_fmadd_pd(
                _mm256_loadu_pd(pa.add(i)),
                _mm256_loadu_pd(pb.add(i)),
                acc[0],
            );
        }
        i += 4;
    }
    let v = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
    let mut s = hsum(v);
    for (x, y) in a[i..].iter().zip(&b[i..]) {
        s = x.mul_add(*y, s);
    }
    s
}

/// The sum, in four 4-lane accumulators.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn sum(a: &[f64]) -> f64 {
    let n = a.len();
    let pa = a.as_ptr();
    let mut acc = [_mm256_setzero_pd(); 4];
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n = a.len().
        unsafe {
            for (u, s) in acc.iter_mut().enumerate() {
                *s = _mm256_add_pd(_mm256_loadu_pd(pa.add(i + 4 * u)), *s);
            }
        }
        i += 16;
    }
    while i + 4 <= n {
        // SAFETY: i + 4 <= n = a.len().
        unsafe {
            acc[0] = _mm256_add_pd(_mm256_loadu_pd(pa.add(i)), acc[0]);
        }
        i += 4;
    }
    let v = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
    hsum(v) + a[i..].iter().sum::<f64>()
}

/// The largest element; NaN if any is NaN, `-inf` for an empty slice.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn max(a: &[f64]) -> f64 {
    let n = a.len();
    let pa = a.as_ptr();
    let mut acc = [_mm256_set1_pd(f64::NEG_INFINITY); 4];
    // Lanes that have seen a NaN (`max_pd` alone would drop them).
    let mut nan = _mm256_setzero_pd();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n = a.len().
        unsafe {
            for (u, m) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_pd(pa.add(i + 4 * u));
                *m = _mm256_max_pd(*m, x);
                nan = _mm256_or_pd(nan, _mm256_cmp_pd::<_CMP_UNORD_Q>(x, x));
            }
        }
        i += 16;
    }
    while i + 4 <= n {
        // SAFETY: i + 4 <= n = a.len().
        unsafe {
            let x = _mm256_loadu_pd(pa.add(i));
            acc[0] = _mm256_max_pd(acc[0], x);
            nan = _mm256_or_pd(nan, _mm256_cmp_pd::<_CMP_UNORD_Q>(x, x));
        }
        i += 4;
    }
    if _mm256_movemask_pd(nan) != 0 {
        return f64::NAN;
    }
    let v = _mm256_max_pd(_mm256_max_pd(acc[0], acc[1]), _mm256_max_pd(acc[2], acc[3]));
    let mut lanes = [0.0f64; 4];
    // SAFETY: `lanes` holds four f64.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), v) };
    let mut m = lanes
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    for &x in &a[i..] {
        if x.is_nan() {
            return f64::NAN;
        }
        if x > m {
            m = x;
        }
    }
    m
}

/// `y = A x`, A row-major with `cols` columns (`cols > 0`), by [`dot`].
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) fn matvec(cols: usize, a: &[f64], x: &[f64], y: &mut [f64]) {
    for (yi, row) in y.iter_mut().zip(a.chunks_exact(cols)) {
        *yi = dot(row, x);
    }
}

/// [`gemm_small`](super::gemm::gemm_small) compiled for AVX2 (it is
/// `#[inline(always)]`); panics unless the slice lengths match the shapes.
///
/// # Safety
///
/// Call only where the CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_small(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    at: bool,
    b: &[f64],
    bt: bool,
    c: &mut [f64],
    accumulate: bool,
) {
    super::gemm::gemm_small(m, n, k, a, at, b, bt, c, accumulate);
}

/// The 6×8 AVX2+FMA micro-kernel (see [`MicroKernel`](super::gemm::MicroKernel)): twelve
/// 256-bit accumulators, two B loads and six A broadcasts per depth step.
///
/// # Safety
///
/// The CPU must support AVX2 and FMA; `a` must address `MR` rows ×
/// `kc` steps of readable elements (with `rs = 1, cs = MR` unless
/// `STRIDED`), `b` must be valid for `kc*NR` reads; `c` must be valid for
/// reads and writes of `MR` rows of `NR` elements at row stride `ldc`, not
/// overlapping the panels, and not accessed by anything else during the call.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn kernel_6x8<const STRIDED: bool>(
    kc: usize,
    a: APanel,
    b: *const f64,
    c: *mut f64,
    ldc: usize,
    overwrite: bool,
) {
    let (rs, cs) = if STRIDED { (a.rs, a.cs) } else { (1, MR) };
    for r in 0..MR {
        // SAFETY: a prefetch reads nothing and faults on no address; these
        // are inside the C tile anyway (r < MR, caller's contract).
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc + NR - 1) as *const i8);
        }
    }
    let mut acc = [[_mm256_setzero_pd(); 2]; MR];
    let (mut pa, mut pb) = (a.ptr, b);
    for _ in 0..kc {
        // SAFETY: step p (< kc) reads A at a.ptr + r*rs + p*cs for r < MR
        // and B at b + p*NR .. b + p*NR + NR, within the panels the caller
        // guarantees readable; the AVX2/FMA intrinsics need the CPU support
        // the caller guarantees.
        unsafe {
            let b0 = _mm256_loadu_pd(pb);
            let b1 = _mm256_loadu_pd(pb.add(4));
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_sd(&*pa.add(r * rs));
                row[0] = _mm256_fmadd_pd(av, b0, row[0]);
                row[1] = _mm256_fmadd_pd(av, b1, row[1]);
            }
            pa = pa.add(cs);
            pb = pb.add(NR);
        }
    }
    for (r, row) in acc.iter().enumerate() {
        // SAFETY: r < MR, so row r of the C tile is NR elements at
        // c + r*ldc, valid for reads and writes by the caller's contract and
        // accessed by nothing else meanwhile.
        unsafe {
            let pc = c.add(r * ldc);
            if overwrite {
                _mm256_storeu_pd(pc, row[0]);
                _mm256_storeu_pd(pc.add(4), row[1]);
            } else {
                _mm256_storeu_pd(pc, _mm256_add_pd(_mm256_loadu_pd(pc), row[0]));
                _mm256_storeu_pd(pc.add(4), _mm256_add_pd(_mm256_loadu_pd(pc.add(4)), row[1]));
            }
        }
    }
}
