//! A contraction whose build side is a dense matrix, run as a GEMM.
//!
//! Where every key's build list is one entry per build group, in order —
//! the rows of `w` for one `d` are `w[d, 0..H]` — the build side *is* the
//! matrix `B` (keys × build groups), and each probe row `(g, k, p)` adds
//! `p · B[k, ..]` to the sums of its group's row. Instead of adding those
//! one row at a time, [`DenseProduct`] lays the probe factors out as a
//! matrix `P` (probe groups × keys, one row's factor per place) and adds
//! `P · B` to the sums with the tensor kernels' blocked GEMM
//! ([`crate::tensor::kernels::gemm`]) when the groups are emitted. `B`
//! is made once per build side ([`matrix`]), `P` in each partition.
//!
//! The answer is the row-at-a-time one, added in another order: a place of
//! `P` holds one probe row's factor (a second row with the same group and
//! key is added at once, as before, never summed into `P` first), an empty
//! place is `0` and adds `0 · B[k, h] = 0` because `B` is taken only when
//! its factors are finite and none is NULL, and the groups of a probe group
//! are made (present, each reached by a non-NULL product) exactly where one
//! of its rows has a place — as the row path makes them. Taken only for one
//! `sum`; while the places laid out stay within a few times the places
//! filled (a sparse probe side keeps adding row by row).

use datafusion::physical_plan::metrics::Count;

use crate::tensor::kernels::gemm;

use super::groups::{Groups, DENSE_SLACK};
use super::Build;

/// The most places of the build matrix taken (keys × build groups).
const MAX_MATRIX: usize = 1 << 24;

/// The build side `build` of `aggregates` sums as the dense matrix `B`
/// (the factor of key `k` and build group `h` at `k · width + h`; zero
/// rows for the keys whose lists are not dense, whose probe rows never get
/// a place in `P`), when it is one: one aggregate, build groups, no links,
/// a key with a dense list, and every factor of those lists finite and not
/// NULL.
pub(super) fn matrix(build: &Build, aggregates: usize) -> Option<Matrix> {
    let width = build.width();
    let keys = build.keys.len();
    let usable = aggregates == 1
        && build.groups.is_some()
        && build.link.is_empty()
        && build.valid.is_empty()
        && build.dense.iter().any(|&d| d)
        && keys.checked_mul(width).is_some_and(|n| n <= MAX_MATRIX);
    if !usable {
        return None;
    }
    if build.dense.iter().all(|&d| d) {
        // The factors listed by key and, within a key, by group are `B`.
        return (build.factor.iter().all(|f| f.is_finite())).then_some(Matrix::Factors);
    }
    let mut matrix = vec![0.0; keys * width];
    for (k, row) in matrix.chunks_exact_mut(width).enumerate() {
        if build.dense[k] {
            let factors = &build.factor[build.starts[k]..build.starts[k + 1]];
            if !factors.iter().all(|f| f.is_finite()) {
                return None;
            }
            row.copy_from_slice(factors);
        }
    }
    Some(Matrix::Own(matrix))
}

/// Where a build side's matrix `B` is.
#[derive(Debug)]
pub(super) enum Matrix {
    /// Every key's list is dense: `B` is the build's factors as listed.
    Factors,
    /// `B` made apart, with zero rows for the keys whose lists are not
    /// dense.
    Own(Vec<f64>),
}

impl Matrix {
    /// The bytes it holds apart from the build's factors.
    pub(super) fn size(&self) -> usize {
        match self {
            Matrix::Factors => 0,
            Matrix::Own(matrix) => matrix.len() * 8,
        }
    }
}

/// The probe factors of a partition laid out against the dense build
/// matrix; see the [module docs](self).
#[derive(Debug)]
pub(super) struct DenseProduct {
    /// The number of keys (columns of `P`, rows of `B`).
    keys: usize,
    /// The number of build groups (columns of `B` and of the sums).
    width: usize,
    /// `P`: probe group `g`'s factor for key `k` at `g · keys + k` (its
    /// last row always has a filled place).
    probe: Vec<f64>,
    /// Whether each place of `P` holds a row's factor.
    filled: Vec<bool>,
    /// The places filled.
    count: usize,
    /// The probe rows added by the GEMM (`gemm_rows` in `EXPLAIN ANALYZE`).
    added: Count,
}

impl DenseProduct {
    /// An empty `P` against `build`'s matrix, when it has one; the rows it
    /// adds counted in `added`.
    pub(super) fn of(build: &Build, added: Count) -> Option<Self> {
        build.matrix.as_ref()?;
        Some(Self {
            keys: build.keys.len(),
            width: build.width(),
            probe: vec![],
            filled: vec![],
            count: 0,
            added,
        })
    }

    /// Lays out probe group `group`'s factor `factor` for key `key` (a key
    /// whose list is dense); `false` where the place is taken already or
    /// laying out the group's row would leave `P` too sparse — the row is
    /// then added as before.
    #[inline]
    pub(super) fn take(&mut self, group: u32, key: u32, factor: f64) -> bool {
        let at = group as usize * self.keys + key as usize;
        if at >= self.probe.len() {
            let end = (group as usize + 1) * self.keys;
            if end > 4 * self.count + DENSE_SLACK {
                return false;
            }
            self.probe.resize(end, 0.0);
            self.filled.resize(end, false);
        }
        if self.filled[at] {
            return false;
        }
        self.probe[at] = factor;
        self.filled[at] = true;
        self.count += 1;
        true
    }

    /// The bytes held, roughly (for the memory pool).
    pub(super) fn size(&self) -> usize {
        self.probe.capacity() * 8 + self.filled.capacity()
    }

    /// Adds `P · B` to `groups` (making the groups of every probe group
    /// with a place), `B` the matrix of `build`, and empties `P`.
    pub(super) fn flush(&mut self, build: &Build, groups: &mut Groups) {
        let matrix = match &build.matrix {
            Some(Matrix::Factors) => &build.factor[..],
            Some(Matrix::Own(matrix)) => &matrix[..],
            None => return,
        };
        if self.count == 0 {
            return;
        }
        let rows = self.probe.len() / self.keys;
        let mut laid_out = true;
        for (g, places) in self.filled.chunks_exact(self.keys).enumerate() {
            if places.contains(&true) && groups.row(g as u32).is_none() {
                laid_out = false;
                break;
            }
        }
        match groups.dense_sums() {
            Some(sums) if laid_out => gemm(
                rows,
                self.width,
                self.keys,
                &self.probe,
                matrix,
                &mut sums[..rows * self.width],
                true,
            ),
            // The groups went to a hash table: each place's products added
            // one by one.
            _ => {
                for (at, &p) in self.probe.iter().enumerate() {
                    if !self.filled[at] {
                        continue;
                    }
                    let (g, k) = ((at / self.keys) as u32, at % self.keys);
                    let factors = &matrix[k * self.width..(k + 1) * self.width];
                    for (h, &b) in factors.iter().enumerate() {
                        let place = groups.place(g, h as u32);
                        groups.add(place, 0, p * b);
                    }
                }
            }
        }
        self.added.add(self.count);
        self.probe.clear();
        self.filled.clear();
        self.count = 0;
    }
}
