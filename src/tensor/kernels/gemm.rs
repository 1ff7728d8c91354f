//! The blocked GEMM driver behind [`gemm`](super::gemm()),
//! [`gemm_tn`](super::gemm_tn) and [`gemm_nt`](super::gemm_nt), in the style
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
//! The micro-kernels themselves are per instruction set
//! (`portable::kernel`, `avx2::kernel_6x8`); this module picks one pair
//! ([`Kernels`]) per call and hands each the panel and tile extents of the
//! [`MicroKernel`] contract.

use std::cell::RefCell;

use super::portable;
#[cfg(target_arch = "x86_64")]
use super::use_avx2;

/// Rows of the GEMM micro-tile.
pub const MR: usize = 6;
/// Columns of the GEMM micro-tile.
pub const NR: usize = 8;
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
pub struct APanel {
    /// Element `(0, 0)`.
    pub ptr: *const f64,
    /// Distance between rows.
    pub rs: usize,
    /// Distance between depth steps.
    pub cs: usize,
}

/// A GEMM micro-kernel: `C[0..MR, 0..NR] (=|+=) A · Bpanel` over `kc` steps.
///
/// Arguments: `kc`, the A micro-panel, the packed B micro-panel (`kc × NR`,
/// `NR` contiguous per step), the C tile pointer, C's row stride, and whether
/// to overwrite C (otherwise accumulate into it).
///
/// # Safety
///
/// The contract of every micro-kernel, which [`gemm_blocked`] keeps: the A
/// micro-panel addresses `MR` rows × `kc` steps of readable elements (with
/// `rs = 1, cs = MR` for the packed kernel); the B pointer is valid for
/// `kc * NR` reads; the C pointer is valid for reads and writes of `MR` rows
/// of `NR` elements at the given row stride, not overlapping either panel,
/// and nothing else accesses that tile during the call; an `avx2` kernel
/// runs only where the CPU supports AVX2 and FMA.
pub(super) type MicroKernel = unsafe fn(usize, APanel, *const f64, *mut f64, usize, bool);

/// The micro-kernels of one instruction set: for packed A, and for A read in
/// place through its strides.
#[derive(Clone, Copy)]
struct Kernels {
    /// For A packed into `MR×kc` micro-panels (`rs = 1, cs = MR`).
    packed: MicroKernel,
    /// For A read in place through the panel's strides.
    strided: MicroKernel,
}

/// C = op(A)·op(B) (+ C). `at`: A is stored k×m (else m×k); `bt`: B is stored
/// n×k (else k×n). Panics unless the slice lengths match the shapes.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_any(
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
            super::avx2::gemm_small(m, n, k, a, at, b, bt, c, accumulate),
            gemm_small(m, n, k, a, at, b, bt, c, accumulate)
        );
    }
    let portable = Kernels {
        packed: portable::kernel::<false>,
        strided: portable::kernel::<true>,
    };
    // The AVX2 micro-kernels only where the CPU has AVX2 and FMA (part of
    // the `MicroKernel` contract that `gemm_blocked` relies on).
    #[cfg(target_arch = "x86_64")]
    let kernels = if use_avx2() {
        Kernels {
            packed: super::avx2::kernel_6x8::<false>,
            strided: super::avx2::kernel_6x8::<true>,
        }
    } else {
        portable
    };
    #[cfg(not(target_arch = "x86_64"))]
    let kernels = portable;
    gemm_blocked(kernels, m, n, k, a, at, b, bt, c, accumulate);
}

/// Direct loops for tiny products, where packing would cost more than it saves.
/// Inlined into `avx2::gemm_small`, so it is compiled for AVX2 there too.
#[inline(always)]
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

/// The blocked product, tile by tile with `kernels`: the AVX2 ones only
/// when `use_avx2` returned true (see [`gemm_any`]).
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
                // SAFETY: the `MicroKernel` contract: `ap` addresses MR rows ×
                // kc steps of A (a full packed panel, or rows row..row+MR of
                // `a` in place), `bp` a full packed panel of NR*kc elements;
                // the tile has row + MR <= m and col + NR <= n, so every
                // element it touches is inside the m*n elements of `c`, which
                // nothing else borrows meanwhile and which the panels (in `a`
                // or the packing buffers) do not overlap; `kernel` is an AVX2
                // one only where the CPU has AVX2 and FMA (`gemm_any`).
                unsafe { kernel(kc, ap, bp, cptr.add(row * n + col), n, overwrite) };
            } else {
                let mut t = [0.0f64; MR * NR];
                // SAFETY: as above for the panels and the CPU; the tile is a
                // local MR×NR array with row stride NR.
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
                copy_padded::<MR>(d, src);
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

/// `src` into the front of `dst` (one depth step of a micro-panel, `dst`
/// `N` long), the rest of `dst` zeroed. A full step is copied as an array
/// of `N`, which compiles to a few vector moves: a slice copy of a run-time
/// length is a call to `memcpy` per step, which took most of the packing
/// time of a wide B.
#[inline(always)]
fn copy_padded<const N: usize>(dst: &mut [f64], src: &[f64]) {
    match (
        <&mut [f64; N]>::try_from(&mut *dst),
        <&[f64; N]>::try_from(src),
    ) {
        (Ok(dst), Ok(src)) => *dst = *src,
        _ => {
            dst[..src.len()].copy_from_slice(src);
            dst[src.len()..].fill(0.0);
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
                copy_padded::<NR>(d, src);
            }
        }
    }
}
