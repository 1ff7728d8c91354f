//! Dense `f64` kernels over flat row-major slices.
//!
//! The tensor functions evaluate a whole Arrow batch at once: the caller hands
//! these kernels the flat child buffer of a `FixedSizeList` column (or one
//! row of it), so every kernel works on plain `&[f64]` / `&mut [f64]` slices
//! with matrices stored row-major.
//!
//! # Dispatch
//!
//! Every public function is a thin dispatcher over two implementations:
//!
//! - `avx2` (x86-64 only): functions compiled with
//!   `#[target_feature(enable = "avx2,fma")]` and written with
//!   `std::arch::x86_64` intrinsics: 4×-unrolled 256-bit loops for the
//!   streaming operations (with non-temporal stores once the output is far
//!   larger than the caches), and a 6×8 register-blocked FMA micro-kernel for
//!   GEMM;
//! - `portable`: plain Rust that the compiler auto-vectorizes for the baseline
//!   target (SSE2 on x86-64, NEON on aarch64, …).
//!
//! The choice is made at run time on each call with
//! `is_x86_feature_detected!`, which reads a cached CPUID bit set, so it costs
//! a couple of loads and a predictable branch; calling an `avx2` function is
//! sound only behind that check, which is what each dispatcher's `unsafe`
//! block relies on. [`isa`] reports which path this machine takes. Unit tests
//! can force the portable path on an AVX2 machine, so both paths are tested.
//!
//! # GEMM
//!
//! [`gemm`], [`gemm_tn`] and [`gemm_nt`] share one blocked driver in the style
//! of BLIS/GotoBLAS: the `k` dimension is split into `KC` blocks, `n` into
//! `NC` blocks and `m` into `MC` blocks; each `KC×NC` block of B is packed into
//! contiguous `KC×NR` micro-panels (kept in L1 while a micro-panel of A
//! streams by), each `MC×KC` block of A into `MR×KC` micro-panels (kept in
//! L2), and the micro-kernel computes an `MR×NR` tile of C from one pair of
//! micro-panels. The transposed variants read A or B through the other stride
//! while packing, so no transpose is ever materialized. When C is narrow
//! (the MLP shapes: `n` of a few dozen), each A panel would meet only a few B
//! panels, so the kernel reads A in place through its strides instead of
//! packing it, and the whole packed B block stays in L2. Partial tiles at the
//! edges are zero-padded in the packed panels and written back through a small
//! scratch tile. Tiny products (and single rows) skip packing and run direct
//! loops. Packing buffers are per-thread and reused (at most
//! `(MC + NC) · KC` doubles, about 4.4 MB, per thread that ran a large GEMM).
//!
//! The kernels are single-threaded: DataFusion already runs one batch per
//! core.

#![warn(unsafe_op_in_unsafe_fn)]

use std::cell::RefCell;

/// Rows of the GEMM micro-tile.
const MR: usize = 6;
/// Columns of the GEMM micro-tile.
const NR: usize = 8;
/// Depth of a packed block (the `k` extent of the micro-panels).
const KC: usize = 256;
/// Rows of a packed block of A (a multiple of `MR`).
const MC: usize = 120;
/// Columns of a packed block of B (a multiple of `NR`).
const NC: usize = 2048;
/// Products with at most this many multiply-adds skip packing.
const SMALL_GEMM: usize = 32 * 32 * 32;
/// C wider than this many columns gets a row-major A packed; narrower C reads
/// A in place, sweeping each A micro-panel over the whole packed B block
/// (`KC × n`, at most 512 KiB here, so it stays in L2).
const PACK_A_MIN_N: usize = 256;
/// The same for a transposed A (stored k×m), whose in-place micro-panels
/// touch a cache line per depth step and so pay off only for narrow C.
const PACK_AT_MIN_N: usize = 4 * NR;

/// Where a micro-kernel reads its `MR` rows of A: element `(r, p)` of the
/// micro-panel is at `ptr + r*rs + p*cs`. Packed panels have `rs = 1`,
/// `cs = MR`; the strided kernels also read A in place.
#[derive(Clone, Copy)]
struct APanel {
    ptr: *const f64,
    rs: usize,
    cs: usize,
}

/// A GEMM micro-kernel: `C[0..MR, 0..NR] (=|+=) A · Bpanel` over `kc` steps.
///
/// Arguments: `kc`, the A micro-panel, the packed B micro-panel (`kc × NR`,
/// `NR` contiguous per step), the C tile pointer, C's row stride, and whether
/// to overwrite C (otherwise accumulate into it).
type MicroKernel = unsafe fn(usize, APanel, *const f64, *mut f64, usize, bool);

/// The micro-kernels of one instruction set: for packed A, and for A read in
/// place through its strides.
#[derive(Clone, Copy)]
struct Kernels {
    packed: MicroKernel,
    strided: MicroKernel,
}

#[cfg(test)]
thread_local! {
    /// Forces the portable path on this thread (tests only).
    static FORCE_PORTABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this call may use the AVX2+FMA implementations.
#[cfg(target_arch = "x86_64")]
#[inline]
fn use_avx2() -> bool {
    #[cfg(test)]
    {
        if FORCE_PORTABLE.with(|f| f.get()) {
            return false;
        }
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
    gemm_any(m, n, k, a, false, b, false, c, accumulate);
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
    gemm_any(m, n, k, a, true, b, false, c, accumulate);
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
    gemm_any(m, n, k, a, false, b, true, c, accumulate);
}

fn check3(a: &[f64], b: &[f64], out: &[f64]) {
    assert!(
        a.len() == out.len() && b.len() == out.len(),
        "kernels: length mismatch ({}, {}, {})",
        a.len(),
        b.len(),
        out.len()
    );
}

/// Output lengths from which the AVX2 streaming kernels use non-temporal
/// stores: 16 MiB of output, so inputs plus output overflow the L3 anyway.
#[cfg(target_arch = "x86_64")]
const STREAM_MIN_LEN: usize = 2 << 20;

// ---------------------------------------------------------------------------
// GEMM driver
// ---------------------------------------------------------------------------

/// C = op(A)·op(B) (+ C). `at`: A is stored k×m (else m×k); `bt`: B is stored
/// n×k (else k×n).
#[allow(clippy::too_many_arguments)]
fn gemm_any(
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
    assert_eq!(a.len(), m * k, "kernels::gemm: A length");
    assert_eq!(b.len(), k * n, "kernels::gemm: B length");
    assert_eq!(c.len(), m * n, "kernels::gemm: C length");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    if m * n * k <= SMALL_GEMM || m == 1 {
        return dispatch!(
            avx2::gemm_small(m, n, k, a, at, b, bt, c, accumulate),
            gemm_small(m, n, k, a, at, b, bt, c, accumulate)
        );
    }
    let portable = Kernels {
        packed: portable::kernel::<false>,
        strided: portable::kernel::<true>,
    };
    #[cfg(target_arch = "x86_64")]
    let kernels = if use_avx2() {
        Kernels {
            packed: avx2::kernel_6x8::<false>,
            strided: avx2::kernel_6x8::<true>,
        }
    } else {
        portable
    };
    #[cfg(not(target_arch = "x86_64"))]
    let kernels = portable;
    gemm_blocked(kernels, m, n, k, a, at, b, bt, c, accumulate);
}

/// Direct loops for tiny products, where packing would cost more than it saves.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm_small(
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
    for (i, crow) in c.chunks_exact_mut(n).enumerate() {
        if !accumulate {
            crow.fill(0.0);
        }
        if bt {
            for (j, cij) in crow.iter_mut().enumerate() {
                let brow = &b[j * k..(j + 1) * k];
                *cij += if at {
                    brow.iter()
                        .enumerate()
                        .map(|(p, &bv)| a[p * m + i] * bv)
                        .sum::<f64>()
                } else {
                    portable::dot(&a[i * k..(i + 1) * k], brow)
                };
            }
        } else {
            for (p, brow) in b.chunks_exact(n).enumerate() {
                let aip = if at { a[p * m + i] } else { a[i * k + p] };
                for (cv, &bv) in crow.iter_mut().zip(brow) {
                    *cv += aip * bv;
                }
            }
        }
    }
}

thread_local! {
    /// Per-thread packing buffers (A block, B block), reused across calls.
    static PACK: RefCell<(Vec<f64>, Vec<f64>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// A 64-byte aligned window of `len` elements inside `buf`, growing it as needed.
fn aligned(buf: &mut Vec<f64>, len: usize) -> &mut [f64] {
    if buf.len() < len + 8 {
        buf.resize(len + 8, 0.0);
    }
    let off = buf.as_ptr().align_offset(64).min(8);
    &mut buf[off..off + len]
}

/// `ceil(total / ceil(total / max))` rounded up to a multiple of `unit`: the
/// block size that splits `total` into the fewest, most even blocks.
fn even_block(total: usize, max: usize, unit: usize) -> usize {
    let blocks = total.div_ceil(max);
    total.div_ceil(blocks).div_ceil(unit) * unit
}

/// The blocked product. Kernel pointers are only ever the AVX2 ones when
/// `use_avx2` returned true (see `gemm_any`).
#[allow(clippy::too_many_arguments)]
fn gemm_blocked(
    kernels: Kernels,
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
    let kc_max = even_block(k, KC, 1);
    let nc_max = even_block(n, NC, NR);
    // Packing A pays off when each packed panel meets many B panels; for
    // narrow C the kernel reads A in place instead (only the last, partial
    // row panel is packed, to zero-pad it).
    let pack_all_a = n > if at { PACK_AT_MIN_N } else { PACK_A_MIN_N };
    let mc_max = if pack_all_a {
        even_block(m, MC, MR)
    } else {
        MR
    };
    PACK.with(|cell| {
        let mut guard = cell.borrow_mut();
        let (abuf, bbuf) = &mut *guard;
        let apack = aligned(abuf, mc_max * kc_max);
        let bpack = aligned(bbuf, nc_max * kc_max);
        let cptr = c.as_mut_ptr();
        // One MR×NR tile of C at (row, col) from an A micro-panel and a packed
        // B micro-panel.
        let tile = |kernel: MicroKernel,
                    kc: usize,
                    ap: APanel,
                    bp: *const f64,
                    row: usize,
                    col: usize,
                    mr: usize,
                    nr: usize,
                    overwrite: bool| {
            if mr == MR && nr == NR {
                // SAFETY: `ap` addresses MR rows × kc steps of A (a full
                // packed panel, or rows row..row+MR of `a` in place), `bp` a
                // full packed panel of NR*kc elements; the tile has
                // row + MR <= m and col + NR <= n, so every element it touches
                // is inside the m*n elements of `c`, which nothing else
                // borrows meanwhile.
                unsafe { kernel(kc, ap, bp, cptr.add(row * n + col), n, overwrite) };
            } else {
                let mut t = [0.0f64; MR * NR];
                // SAFETY: as above for the panels; the tile is a local MR×NR
                // array with row stride NR.
                unsafe { kernel(kc, ap, bp, t.as_mut_ptr(), NR, true) };
                for (r, trow) in t.chunks_exact(NR).take(mr).enumerate() {
                    // SAFETY: row + r < m and col + nr <= n: these nr elements
                    // are inside `c`, which nothing else borrows meanwhile.
                    let crow = unsafe {
                        std::slice::from_raw_parts_mut(cptr.add((row + r) * n + col), nr)
                    };
                    if overwrite {
                        crow.copy_from_slice(&trow[..nr]);
                    } else {
                        for (cv, &tv) in crow.iter_mut().zip(trow) {
                            *cv += tv;
                        }
                    }
                }
            }
        };
        for jc in (0..n).step_by(nc_max) {
            let nc = nc_max.min(n - jc);
            for pc in (0..k).step_by(kc_max) {
                let kc = kc_max.min(k - pc);
                let overwrite = !accumulate && pc == 0;
                pack_b(b, bt, n, k, pc, kc, jc, nc, bpack);
                let bpanel = |jr: usize| bpack[(jr / NR) * NR * kc..][..NR * kc].as_ptr();
                if pack_all_a {
                    for ic in (0..m).step_by(mc_max) {
                        let mc = mc_max.min(m - ic);
                        pack_a(a, at, m, k, ic, mc, pc, kc, apack);
                        for jr in (0..nc).step_by(NR) {
                            let nr = NR.min(nc - jr);
                            for ir in (0..mc).step_by(MR) {
                                let mr = MR.min(mc - ir);
                                let ap = APanel {
                                    ptr: apack[(ir / MR) * MR * kc..][..MR * kc].as_ptr(),
                                    rs: 1,
                                    cs: MR,
                                };
                                tile(
                                    kernels.packed,
                                    kc,
                                    ap,
                                    bpanel(jr),
                                    ic + ir,
                                    jc + jr,
                                    mr,
                                    nr,
                                    overwrite,
                                );
                            }
                        }
                    }
                } else {
                    for ir in (0..m).step_by(MR) {
                        let mr = MR.min(m - ir);
                        let (kernel, ap) = if mr < MR {
                            pack_a(a, at, m, k, ir, mr, pc, kc, apack);
                            (
                                kernels.packed,
                                APanel {
                                    ptr: apack.as_ptr(),
                                    rs: 1,
                                    cs: MR,
                                },
                            )
                        } else if at {
                            // A stored k×m: A(i, p) = a[p*m + i].
                            let ptr = a[pc * m + ir..].as_ptr();
                            (kernels.strided, APanel { ptr, rs: 1, cs: m })
                        } else {
                            // A stored m×k: A(i, p) = a[i*k + p].
                            let ptr = a[ir * k + pc..].as_ptr();
                            (kernels.strided, APanel { ptr, rs: k, cs: 1 })
                        };
                        for jr in (0..nc).step_by(NR) {
                            let nr = NR.min(nc - jr);
                            tile(kernel, kc, ap, bpanel(jr), ir, jc + jr, mr, nr, overwrite);
                        }
                    }
                }
            }
        }
    });
}

/// Packs rows `i0..i0+mc`, depths `p0..p0+kc` of A into `MR×kc` micro-panels
/// (`MR` consecutive rows per depth step), zero-padding the last panel.
#[allow(clippy::too_many_arguments)]
fn pack_a(
    a: &[f64],
    at: bool,
    m: usize,
    k: usize,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f64],
) {
    for (ir, panel) in (0..mc).step_by(MR).zip(dst.chunks_exact_mut(MR * kc)) {
        let mr = MR.min(mc - ir);
        if at {
            // A is stored k×m: the MR rows of one depth step are contiguous.
            for (p, d) in panel.chunks_exact_mut(MR).enumerate() {
                let src = &a[(p0 + p) * m + i0 + ir..][..mr];
                d[..mr].copy_from_slice(src);
                d[mr..].fill(0.0);
            }
        } else {
            // A is stored m×k: each row is contiguous along the depth.
            for r in 0..mr {
                let src = &a[(i0 + ir + r) * k + p0..][..kc];
                for (d, &v) in panel.chunks_exact_mut(MR).zip(src) {
                    d[r] = v;
                }
            }
            if mr < MR {
                for d in panel.chunks_exact_mut(MR) {
                    d[mr..].fill(0.0);
                }
            }
        }
    }
}

/// Packs depths `p0..p0+kc`, columns `j0..j0+nc` of B into `kc×NR`
/// micro-panels (`NR` consecutive columns per depth step), zero-padding the
/// last panel.
#[allow(clippy::too_many_arguments)]
fn pack_b(
    b: &[f64],
    bt: bool,
    n: usize,
    k: usize,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    dst: &mut [f64],
) {
    for (jr, panel) in (0..nc).step_by(NR).zip(dst.chunks_exact_mut(NR * kc)) {
        let nr = NR.min(nc - jr);
        if bt {
            // B is stored n×k: each column is contiguous along the depth.
            for j in 0..nr {
                let src = &b[(j0 + jr + j) * k + p0..][..kc];
                for (d, &v) in panel.chunks_exact_mut(NR).zip(src) {
                    d[j] = v;
                }
            }
            if nr < NR {
                for d in panel.chunks_exact_mut(NR) {
                    d[nr..].fill(0.0);
                }
            }
        } else {
            // B is stored k×n: the NR columns of one depth step are contiguous.
            for (p, d) in panel.chunks_exact_mut(NR).enumerate() {
                let src = &b[(p0 + p) * n + j0 + jr..][..nr];
                d[..nr].copy_from_slice(src);
                d[nr..].fill(0.0);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Portable implementations
// ---------------------------------------------------------------------------

/// Plain-Rust kernels, auto-vectorized for the baseline target.
mod portable {
    use super::{APanel, MR, NR};

    pub(super) fn add(a: &[f64], b: &[f64], out: &mut [f64]) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = x + y;
        }
    }

    pub(super) fn sub(a: &[f64], b: &[f64], out: &mut [f64]) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = x - y;
        }
    }

    pub(super) fn mul(a: &[f64], b: &[f64], out: &mut [f64]) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = x * y;
        }
    }

    pub(super) fn div(a: &[f64], b: &[f64], out: &mut [f64]) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = x / y;
        }
    }

    pub(super) fn scale(a: &[f64], s: f64, out: &mut [f64]) {
        for (o, &x) in out.iter_mut().zip(a) {
            *o = x * s;
        }
    }

    pub(super) fn add_scalar(a: &[f64], s: f64, out: &mut [f64]) {
        for (o, &x) in out.iter_mut().zip(a) {
            *o = x + s;
        }
    }

    pub(super) fn axpy(alpha: f64, x: &[f64], y: &mut [f64]) {
        for (v, &u) in y.iter_mut().zip(x) {
            *v += alpha * u;
        }
    }

    /// Dot product with 8 independent partial sums (vectorizable).
    #[inline(always)]
    pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
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

    fn reduce8(acc: [f64; 8]) -> f64 {
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
    }

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

    pub(super) fn relu(a: &[f64], out: &mut [f64]) {
        for (o, &x) in out.iter_mut().zip(a) {
            // Same as `max_pd(0, x)`: NaN and -0.0 pass through.
            *o = if x < 0.0 { 0.0 } else { x };
        }
    }

    pub(super) fn matvec(cols: usize, a: &[f64], x: &[f64], y: &mut [f64]) {
        for (yi, row) in y.iter_mut().zip(a.chunks_exact(cols)) {
            *yi = dot(row, x);
        }
    }

    /// Portable `MR×NR` micro-kernel (see [`super::MicroKernel`]).
    ///
    /// # Safety
    ///
    /// `a` must address `MR` rows × `kc` steps of readable elements (with
    /// `rs = 1, cs = MR` unless `STRIDED`), `b` must be valid for `kc*NR`
    /// reads; `c` must be valid for reads and writes of `MR` rows of `NR`
    /// elements at row stride `ldc`, not overlapping the panels.
    pub(super) unsafe fn kernel<const STRIDED: bool>(
        kc: usize,
        a: APanel,
        b: *const f64,
        c: *mut f64,
        ldc: usize,
        overwrite: bool,
    ) {
        let (rs, cs) = if STRIDED { (a.rs, a.cs) } else { (1, MR) };
        // SAFETY: the caller guarantees the B panel holds kc*NR elements.
        let bp = unsafe { std::slice::from_raw_parts(b, kc * NR) };
        let mut acc = [[0.0f64; NR]; MR];
        for (p, bv) in bp.chunks_exact(NR).enumerate() {
            let mut av = [0.0f64; MR];
            for (r, x) in av.iter_mut().enumerate() {
                // SAFETY: (r, p) is inside the A panel the caller guarantees.
                *x = unsafe { *a.ptr.add(r * rs + p * cs) };
            }
            for (accr, &ar) in acc.iter_mut().zip(&av) {
                for (x, &bj) in accr.iter_mut().zip(bv) {
                    *x += ar * bj;
                }
            }
        }
        for (r, accr) in acc.iter().enumerate() {
            // SAFETY: row r of the tile is NR valid elements at c + r*ldc
            // (caller's contract), and nothing else borrows them.
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
}

// ---------------------------------------------------------------------------
// AVX2 + FMA implementations
// ---------------------------------------------------------------------------

/// Kernels compiled for AVX2+FMA; call them only after checking the CPU.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{APanel, MR, NR, STREAM_MIN_LEN};

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

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn add(a: &[f64], b: &[f64], out: &mut [f64]) {
        binary_loop!(a, b, out, |x, y| _mm256_add_pd(x, y), |x, y| x + y);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn sub(a: &[f64], b: &[f64], out: &mut [f64]) {
        binary_loop!(a, b, out, |x, y| _mm256_sub_pd(x, y), |x, y| x - y);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn mul(a: &[f64], b: &[f64], out: &mut [f64]) {
        binary_loop!(a, b, out, |x, y| _mm256_mul_pd(x, y), |x, y| x * y);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn div(a: &[f64], b: &[f64], out: &mut [f64]) {
        binary_loop!(a, b, out, |x, y| _mm256_div_pd(x, y), |x, y| x / y);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn scale(a: &[f64], s: f64, out: &mut [f64]) {
        let sv = _mm256_set1_pd(s);
        unary_loop!(a, out, |x| _mm256_mul_pd(x, sv), |x| x * s);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn add_scalar(a: &[f64], s: f64, out: &mut [f64]) {
        let sv = _mm256_set1_pd(s);
        unary_loop!(a, out, |x| _mm256_add_pd(x, sv), |x| x + s);
    }

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
                    let r =
                        _mm256_fmadd_pd(av, _mm256_loadu_pd(px.add(o)), _mm256_loadu_pd(py.add(o)));
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
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256d) -> f64 {
        let s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
        _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
    }

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
                    *s =
                        _mm256_fmadd_pd(_mm256_loadu_pd(pa.add(o)), _mm256_loadu_pd(pb.add(o)), *s);
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

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn matvec(cols: usize, a: &[f64], x: &[f64], y: &mut [f64]) {
        for (yi, row) in y.iter_mut().zip(a.chunks_exact(cols)) {
            *yi = dot(row, x);
        }
    }

    /// [`super::gemm_small`] compiled for AVX2.
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
        super::gemm_small(m, n, k, a, at, b, bt, c, accumulate);
    }

    /// The 6×8 AVX2+FMA micro-kernel (see [`super::MicroKernel`]): twelve
    /// 256-bit accumulators, two B loads and six A broadcasts per depth step.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2 and FMA; `a` must address `MR` rows ×
    /// `kc` steps of readable elements (with `rs = 1, cs = MR` unless
    /// `STRIDED`), `b` must be valid for `kc*NR` reads; `c` must be valid for
    /// reads and writes of `MR` rows of `NR` elements at row stride `ldc`.
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
            // SAFETY: prefetching is a hint; the addresses are the C tile's.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc + NR - 1) as *const i8);
            }
        }
        let mut acc = [[_mm256_setzero_pd(); 2]; MR];
        let (mut pa, mut pb) = (a.ptr, b);
        for _ in 0..kc {
            // SAFETY: each of the kc steps reads MR elements of the A panel
            // and NR of the B panel, within the extents the caller guarantees.
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
            // SAFETY: row r of the C tile is NR elements at c + r*ldc, valid
            // for reads and writes by the caller's contract.
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
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Deterministic pseudo-random values in [-1, 1).
    fn data(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
            })
            .collect()
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
                let (a, b) = (data(n, 1), data(n, 2));
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
                let a = data(n, 3);
                let mut out = vec![f64::NAN; n];
                scale(&a, -2.5, &mut out);
                assert!(out.iter().zip(&a).all(|(o, x)| *o == x * -2.5));
                add_scalar(&a, 0.75, &mut out);
                assert!(out.iter().zip(&a).all(|(o, x)| *o == x + 0.75));
                relu(&a, &mut out);
                assert!(out.iter().zip(&a).all(|(o, x)| *o == x.max(0.0)));
                map(&a, &mut out, f64::exp);
                assert!(out.iter().zip(&a).all(|(o, x)| *o == x.exp()));
                let mut y = data(n, 4);
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
            let (a, b) = (data(n + 1, 5), data(n + 1, 6));
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
                let mut a = data(n, 7);
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
                let (a, b) = (data(n, 8), data(n, 9));
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
                    let mut a = data(n, 10);
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
                let a = data(r * c, 11);
                let mut t = vec![f64::NAN; r * c];
                transpose(r, c, &a, &mut t);
                for i in 0..r {
                    for j in 0..c {
                        assert_eq!(t[j * r + i], a[i * c + j]);
                    }
                }
                let (u, v) = (data(r, 12), data(c, 13));
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
                let (a, b) = (data(m * k, 14), data(k * n, 15));
                let c0 = data(m * n, 16);
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
            let (a, b) = (data(m * k, 17), data(k * n, 18));
            let mut buf = vec![7.0; m * n + 16];
            gemm(m, n, k, &a, &b, &mut buf[8..8 + m * n], false);
            assert!(buf[..8].iter().chain(&buf[8 + m * n..]).all(|&v| v == 7.0));
        });
    }

    #[test]
    fn portable_variants_directly() {
        let (a, b) = (data(33, 19), data(33, 20));
        let mut out = vec![0.0; 33];
        portable::add(&a, &b, &mut out);
        assert!(out
            .iter()
            .zip(a.iter().zip(&b))
            .all(|(o, (x, y))| *o == x + y));
        let naive: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!(close(portable::dot(&a, &b), naive, 33.0));
        let mut tile = [0.0; MR * NR];
        let (pa, pb) = (data(3 * MR, 21), data(3 * NR, 22));
        // SAFETY: the panels hold 3*MR and 3*NR elements and the tile MR×NR.
        let ap = APanel {
            ptr: pa.as_ptr(),
            rs: 1,
            cs: MR,
        };
        unsafe { portable::kernel::<false>(3, ap, pb.as_ptr(), tile.as_mut_ptr(), NR, true) };
        for r in 0..MR {
            for j in 0..NR {
                let w: f64 = (0..3).map(|p| pa[p * MR + r] * pb[p * NR + j]).sum();
                assert!(close(tile[r * NR + j], w, 3.0));
            }
        }
    }
}
