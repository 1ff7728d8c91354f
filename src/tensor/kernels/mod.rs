//! Dense `f64` kernels over flat row-major slices.
//!
//! The tensor functions evaluate a whole Arrow batch at once: the caller hands
//! these kernels the flat child buffer of a `FixedSizeList` column (or one
//! row of it), so every kernel works on plain `&[f64]` / `&mut [f64]` slices
//! with matrices stored row-major.
//!
//! # Layout and dispatch
//!
//! This module holds the public functions. Each checks its arguments' lengths
//! and is a thin dispatcher (the `dispatch!` macro) over two implementations:
//!
//! - `avx2` (`avx2.rs`, x86-64 only): functions compiled with
//!   `#[target_feature(enable = "avx2,fma")]` and written with
//!   `std::arch::x86_64` intrinsics: 4×-unrolled 256-bit loops for the
//!   streaming operations (with non-temporal stores once the output is far
//!   larger than the caches), and a 6×8 register-blocked FMA micro-kernel for
//!   GEMM;
//! - `portable` (`portable.rs`): plain Rust that the compiler auto-vectorizes
//!   for the baseline target (SSE2 on x86-64, NEON on aarch64, …).
//!
//! [`gemm()`], [`gemm_tn`] and [`gemm_nt`] share one blocked driver in the
//! style of BLIS/GotoBLAS (`gemm.rs`: blocking, packing, and the loop over
//! micro-tiles that calls either instruction set's micro-kernel).
//!
//! The choice is made at run time on each call with
//! `is_x86_feature_detected!`, which reads a cached CPUID bit set, so it costs
//! a couple of loads and a predictable branch. [`isa`] reports which path
//! this machine takes. The unit tests (`tests/unit/tensor_kernels.rs`) can
//! force the portable path on an AVX2 machine (`FORCE_PORTABLE`), so both
//! paths are tested; the flag is a thread-local `Cell` with a constant
//! initializer, one more load per call beside the CPUID bits.
//!
//! # Safety
//!
//! As in arrow-rs, every `unsafe` block carries a `// SAFETY:` comment with
//! the argument that it is sound, and every function that is unsafe to call
//! (an `unsafe fn`, or a `#[target_feature]` function of `avx2`) a
//! `# Safety` section with the contract its callers keep. Two kinds of
//! obligation occur:
//!
//! - an `avx2` function runs only on a CPU with AVX2 and FMA: each call is
//!   behind the run-time check of `dispatch!`, or (the GEMM micro-kernels,
//!   called through a function pointer) chosen by the GEMM driver only after
//!   that check;
//! - raw-pointer reads and writes stay inside the slices the pointers come
//!   from: the loop bounds of each kernel, and for the GEMM micro-kernels the
//!   panel and tile extents that the driver passes, keep them there.
//!
//! The kernels are single-threaded: DataFusion already runs one batch per
//! core.

#![warn(unsafe_op_in_unsafe_fn)]

thread_local! {
    /// Forces the portable path on this thread (for the tests).
    // pub for the tests in tests/unit/tensor_kernels.rs
    #[doc(hidden)]
    pub static FORCE_PORTABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this call may use the AVX2+FMA implementations.
#[cfg(target_arch = "x86_64")]
#[inline]
fn use_avx2() -> bool {
    if FORCE_PORTABLE.with(|f| f.get()) {
        return false;
    }
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// Calls the AVX2 implementation when the CPU supports it, else the portable one.
macro_rules! dispatch {
    ($avx2:expr, $portable:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if use_avx2() {
                // SAFETY: `use_avx2` checked that this CPU supports AVX2 and
                // FMA, the only requirement of the `avx2` functions beyond
                // their (safe) slice arguments.
                return unsafe { $avx2 };
            }
        }
        $portable
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx2;
// pub for the tests in tests/unit/tensor_kernels.rs
#[doc(hidden)]
pub mod gemm;
// pub for the tests in tests/unit/tensor_kernels.rs
#[doc(hidden)]
pub mod portable;

/// Which instruction set the dispatcher picked on this machine:
/// `"avx2+fma"` or `"portable"`.
pub fn isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if use_avx2() {
            return "avx2+fma";
        }
    }
    "portable"
}

/// Elementwise `out = a + b`. Panics unless all lengths are equal.
pub fn add(a: &[f64], b: &[f64], out: &mut [f64]) {
    check3(a, b, out);
    dispatch!(avx2::add(a, b, out), portable::add(a, b, out))
}

/// Elementwise `out = a - b`. Panics unless all lengths are equal.
pub fn sub(a: &[f64], b: &[f64], out: &mut [f64]) {
    check3(a, b, out);
    dispatch!(avx2::sub(a, b, out), portable::sub(a, b, out))
}

/// Elementwise `out = a * b`. Panics unless all lengths are equal.
pub fn mul(a: &[f64], b: &[f64], out: &mut [f64]) {
    check3(a, b, out);
    dispatch!(avx2::mul(a, b, out), portable::mul(a, b, out))
}

/// Elementwise `out = a / b`. Panics unless all lengths are equal.
pub fn div(a: &[f64], b: &[f64], out: &mut [f64]) {
    check3(a, b, out);
    dispatch!(avx2::div(a, b, out), portable::div(a, b, out))
}

/// `out = a * s`. Panics unless `a` and `out` have equal lengths.
pub fn scale(a: &[f64], s: f64, out: &mut [f64]) {
    assert_eq!(a.len(), out.len(), "kernels::scale: length mismatch");
    dispatch!(avx2::scale(a, s, out), portable::scale(a, s, out))
}

/// `out = a + s`. Panics unless `a` and `out` have equal lengths.
pub fn add_scalar(a: &[f64], s: f64, out: &mut [f64]) {
    assert_eq!(a.len(), out.len(), "kernels::add_scalar: length mismatch");
    dispatch!(avx2::add_scalar(a, s, out), portable::add_scalar(a, s, out))
}

/// `y += alpha * x` (fused multiply-add on the AVX2 path). Panics unless `x`
/// and `y` have equal lengths.
pub fn axpy(alpha: f64, x: &[f64], y: &mut [f64]) {
    assert_eq!(x.len(), y.len(), "kernels::axpy: length mismatch");
    dispatch!(avx2::axpy(alpha, x, y), portable::axpy(alpha, x, y))
}

/// The dot product `Σ a[i]·b[i]` (several partial sums, so the rounding
/// differs slightly from a left-to-right loop). Panics unless the lengths are
/// equal.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "kernels::dot: length mismatch");
    dispatch!(avx2::dot(a, b), portable::dot(a, b))
}

/// The sum `Σ a[i]` (several partial sums); `0.0` for an empty slice.
pub fn sum(a: &[f64]) -> f64 {
    dispatch!(avx2::sum(a), portable::sum(a))
}

/// The largest element: NaN if any element is NaN, `-inf` for an empty slice.
pub fn max(a: &[f64]) -> f64 {
    dispatch!(avx2::max(a), portable::max(a))
}

/// Elementwise `out[i] = f(a[i])`, for functions without a SIMD kernel
/// (`exp`, `ln`, `tanh`, …). Panics unless `a` and `out` have equal lengths.
pub fn map(a: &[f64], out: &mut [f64], f: impl Fn(f64) -> f64) {
    assert_eq!(a.len(), out.len(), "kernels::map: length mismatch");
    for (o, &x) in out.iter_mut().zip(a) {
        *o = f(x);
    }
}

/// Elementwise `out = max(a, 0)`; NaN stays NaN. Panics unless `a` and `out`
/// have equal lengths.
pub fn relu(a: &[f64], out: &mut [f64]) {
    assert_eq!(a.len(), out.len(), "kernels::relu: length mismatch");
    dispatch!(avx2::relu(a, out), portable::relu(a, out))
}

/// `out` (cols×rows) = transpose of `a` (rows×cols), both row-major, in
/// cache-sized square blocks. Panics unless both hold `rows * cols` elements.
pub fn transpose(rows: usize, cols: usize, a: &[f64], out: &mut [f64]) {
    assert_eq!(a.len(), rows * cols, "kernels::transpose: input length");
    assert_eq!(out.len(), rows * cols, "kernels::transpose: output length");
    const TB: usize = 32;
    for i0 in (0..rows).step_by(TB) {
        let i1 = (i0 + TB).min(rows);
        for j0 in (0..cols).step_by(TB) {
            let j1 = (j0 + TB).min(cols);
            for i in i0..i1 {
                let row = &a[i * cols + j0..i * cols + j1];
                for (j, &v) in (j0..j1).zip(row) {
                    out[j * rows + i] = v;
                }
            }
        }
    }
}

/// The outer product `out[i * b.len() + j] = a[i] * b[j]`. Panics unless
/// `out.len() == a.len() * b.len()`.
pub fn outer(a: &[f64], b: &[f64], out: &mut [f64]) {
    assert_eq!(
        out.len(),
        a.len() * b.len(),
        "kernels::outer: output length"
    );
    if b.is_empty() {
        return;
    }
    for (&ai, row) in a.iter().zip(out.chunks_exact_mut(b.len())) {
        scale(b, ai, row);
    }
}

/// `y = A x` for `A` a `rows×cols` row-major matrix. Panics unless
/// `a.len() == rows * cols`, `x.len() == cols` and `y.len() == rows`.
pub fn matvec(rows: usize, cols: usize, a: &[f64], x: &[f64], y: &mut [f64]) {
    assert_eq!(a.len(), rows * cols, "kernels::matvec: matrix length");
    assert_eq!(x.len(), cols, "kernels::matvec: vector length");
    assert_eq!(y.len(), rows, "kernels::matvec: output length");
    if cols == 0 {
        y.fill(0.0);
        return;
    }
    dispatch!(avx2::matvec(cols, a, x, y), portable::matvec(cols, a, x, y))
}

/// C (m×n) = A (m×k) · B (k×n), all row-major; `accumulate` adds into C
/// instead of overwriting it. Panics unless the slice lengths match the
/// shapes.
pub fn gemm(m: usize, n: usize, k: usize, a: &[f64], b: &[f64], c: &mut [f64], accumulate: bool) {
    gemm::gemm_any(m, n, k, a, false, b, false, c, accumulate);
}

/// C (m×n) = Aᵀ · B where A is k×m row-major and B is k×n (used for weight
/// gradients: Xᵀ·G); `accumulate` adds into C. Panics unless the slice
/// lengths match the shapes.
pub fn gemm_tn(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    b: &[f64],
    c: &mut [f64],
    accumulate: bool,
) {
    gemm::gemm_any(m, n, k, a, true, b, false, c, accumulate);
}

/// C (m×n) = A · Bᵀ where A is m×k and B is n×k row-major (used for backprop
/// through X·W: G·Wᵀ); `accumulate` adds into C. Panics unless the slice
/// lengths match the shapes.
pub fn gemm_nt(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    b: &[f64],
    c: &mut [f64],
    accumulate: bool,
) {
    gemm::gemm_any(m, n, k, a, false, b, true, c, accumulate);
}

/// Panics unless `a`, `b` and `out` have equal lengths.
fn check3(a: &[f64], b: &[f64], out: &[f64]) {
    assert!(
        a.len() == out.len() && b.len() == out.len(),
        "kernels: length mismatch ({}, {}, {})",
        a.len(),
        b.len(),
        out.len()
    );
}
