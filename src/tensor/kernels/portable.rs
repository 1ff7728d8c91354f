//! Plain-Rust kernels that the compiler auto-vectorizes for the baseline
//! target (SSE2 on x86-64, NEON on aarch64, …): the fallback of every
//! dispatcher in the parent module, and the only path off x86-64.
//!
//! The callers have checked the lengths; only the GEMM micro-kernel
//! ([`kernel`]) is `unsafe`, reading its panels through raw pointers.

use super::gemm::{APanel, MR, NR};

/// `out = a + b` (lengths checked by the caller).
pub fn add(a: &[f64], b: &[f64], out: &mut [f64]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// `out = a - b`.
pub(super) fn sub(a: &[f64], b: &[f64], out: &mut [f64]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x - y;
    }
}

/// `out = a * b`.
pub(super) fn mul(a: &[f64], b: &[f64], out: &mut [f64]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x * y;
    }
}

/// `out = a / b`.
pub(super) fn div(a: &[f64], b: &[f64], out: &mut [f64]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x / y;
    }
}

/// `out = a * s`.
pub(super) fn scale(a: &[f64], s: f64, out: &mut [f64]) {
    for (o, &x) in out.iter_mut().zip(a) {
        *o = x * s;
    }
}

/// `out = a + s`.
pub(super) fn add_scalar(a: &[f64], s: f64, out: &mut [f64]) {
    for (o, &x) in out.iter_mut().zip(a) {
        *o = x + s;
    }
}

/// `y += alpha * x`.
pub(super) fn axpy(alpha: f64, x: &[f64], y: &mut [f64]) {
    for (v, &u) in y.iter_mut().zip(x) {
        *v += alpha * u;
    }
}

/// Dot product with 8 independent partial sums (vectorizable).
#[inline(always)]
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    reduce8(acc) + tail
}

/// The sum, with 8 independent partial sums (vectorizable).
pub(super) fn sum(a: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let ca = a.chunks_exact(8);
    let tail: f64 = ca.remainder().iter().sum();
    for x in ca {
        for l in 0..8 {
            acc[l] += x[l];
        }
    }
    reduce8(acc) + tail
}

/// The sum of the 8 partial sums, pairwise.
fn reduce8(acc: [f64; 8]) -> f64 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// The largest element; NaN if any is NaN.
pub(super) fn max(a: &[f64]) -> f64 {
    let mut m = f64::NEG_INFINITY;
    let mut nan = false;
    for &x in a {
        nan |= x.is_nan();
        m = if x > m { x } else { m };
    }
    if nan {
        f64::NAN
    } else {
        m
    }
}

/// `out = max(a, 0)`, NaN and -0.0 passing through.
pub(super) fn relu(a: &[f64], out: &mut [f64]) {
    for (o, &x) in out.iter_mut().zip(a) {
        // Same as `max_pd(0, x)`: NaN and -0.0 pass through.
        *o = if x < 0.0 { 0.0 } else { x };
    }
}

/// `y = A x`, A row-major with `cols` columns (`cols > 0`).
pub(super) fn matvec(cols: usize, a: &[f64], x: &[f64], y: &mut [f64]) {
    for (yi, row) in y.iter_mut().zip(a.chunks_exact(cols)) {
        *yi = dot(row, x);
    }
}

/// Portable `MR×NR` micro-kernel (see [`MicroKernel`](super::gemm::MicroKernel)).
///
/// # Safety
///
/// `a` must address `MR` rows × `kc` steps of readable elements (with
/// `rs = 1, cs = MR` unless `STRIDED`), `b` must be valid for `kc*NR`
/// reads; `c` must be valid for reads and writes of `MR` rows of `NR`
/// elements at row stride `ldc`, not overlapping the panels, and not
/// accessed by anything else during the call.
pub unsafe fn kernel<const STRIDED: bool>(
    kc: usize,
    a: APanel,
    b: *const f64,
    c: *mut f64,
    ldc: usize,
    overwrite: bool,
) {
    let (rs, cs) = if STRIDED { (a.rs, a.cs) } else { (1, MR) };
    // SAFETY: the caller guarantees that `b` is valid for kc*NR reads, and
    // nothing writes the panel during the call (it does not overlap C).
    let bp = unsafe { std::slice::from_raw_parts(b, kc * NR) };
    let mut acc = [[0.0f64; NR]; MR];
    for (p, bv) in bp.chunks_exact(NR).enumerate() {
        let mut av = [0.0f64; MR];
        for (r, x) in av.iter_mut().enumerate() {
            // SAFETY: r < MR and p < kc, so (r, p) is inside the A panel the
            // caller guarantees readable.
            *x = unsafe { *a.ptr.add(r * rs + p * cs) };
        }
        for (accr, &ar) in acc.iter_mut().zip(&av) {
            for (x, &bj) in accr.iter_mut().zip(bv) {
                *x += ar * bj;
            }
        }
    }
    for (r, accr) in acc.iter().enumerate() {
        // SAFETY: r < MR, so row r of the tile is NR elements at c + r*ldc,
        // valid for reads and writes by the caller's contract; nothing else
        // accesses them meanwhile (`bp` does not overlap C).
        let crow = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), NR) };
        if overwrite {
            crow.copy_from_slice(accr);
        } else {
            for (cv, &x) in crow.iter_mut().zip(accr) {
                *cv += x;
            }
        }
    }
}
