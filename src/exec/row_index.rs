//! The parameter rows of a gradient table found by their identity: the
//! lookup [`super::group_join`] probes with every contribution.
//!
//! Identities of integer columns spanning a small range (ids, the indices
//! of a matrix's entries: the usual case) are numbered directly — one slot
//! per possible identity, no hashing, and contributions in identity order
//! touch the slots in order. So are identities whose integer columns alone
//! tell the rows apart (an id beside a feature vector, a float, a string):
//! by those columns only, the others unread — a contribution's identity is
//! always one of the parameter rows' own (both are read from the same
//! relation), so the one row with its integer columns is its row. Any
//! other identity (strings, floats, NULLs, sparse integers) goes through a
//! hash table with chains. Both fail with the duplicate-rows check's typed
//! error where two rows share an identity.

use datafusion::arrow::array::{
    make_comparator, Array, ArrayRef, AsArray, DynComparator, RecordBatch,
};
use datafusion::arrow::compute::kernels::aggregate::{max, min};
use datafusion::arrow::compute::{cast, SortOptions};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type};
use datafusion::common::hash_utils::{create_hashes, RandomState};
use datafusion::common::{internal_err, HashMap};
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;

use crate::error::{fail, ErrorKind};

/// The typed error two parameter rows with one identity raise (the
/// duplicate-rows check of the gradient table's planner).
#[derive(Debug, Clone)]
pub struct Duplicate {
    /// The error's kind.
    pub kind: ErrorKind,
    /// Its message: what is not one row, and how to write it.
    pub message: String,
}

/// No row (an empty slot, the end of a chain).
const NONE: u32 = u32::MAX;

/// How many slots per row a directly numbered identity may take.
const SLOTS_PER_ROW: u128 = 4;

/// The parameter rows, found by their identity (see the [module docs](self)).
pub(super) struct RowIndex {
    /// The rows' identity columns.
    keys: Vec<ArrayRef>,
    rows: usize,
    lookup: Lookup,
    /// The memory of the index and of the sums being added, in the pool.
    reservation: MemoryReservation,
}

/// How an identity leads to its row.
enum Lookup {
    /// Integer identities: the slot of `Σ (key_c − low_c) · stride_c`
    /// holds the row (each key within `low_c..=high_c`).
    Numbered {
        /// The identity columns numbered (all, or the integer ones).
        columns: Vec<usize>,
        low: Vec<i64>,
        high: Vec<i64>,
        stride: Vec<u64>,
        slots: Vec<u32>,
    },
    /// Any identity: each hash's latest row, and for every row the one
    /// before it with the same hash.
    Hashed {
        first: HashMap<u64, u32>,
        next: Vec<u32>,
        hashing: RandomState,
    },
}

/// One task's sums, one per parameter row, and their memory in the pool
/// (held until they are dropped).
pub(super) struct Sums {
    pub values: Vec<f64>,
    /// Where asked for, a bit per row (row `r`: bit `r % 64` of word
    /// `r / 64`) set where the row got a contribution; else empty.
    pub touched: Vec<u64>,
    _memory: MemoryReservation,
}

impl Sums {
    /// Adds the contribution `partial` to row `row`, marking it touched
    /// where that is kept.
    pub fn add(&mut self, row: usize, partial: f64) {
        self.values[row] += partial;
        if let Some(word) = self.touched.get_mut(row / 64) {
            *word |= 1 << (row % 64);
        }
    }

    /// Whether row `row` got a contribution (kept where asked for).
    pub fn is_touched(&self, row: usize) -> bool {
        self.touched[row / 64] & (1 << (row % 64)) != 0
    }

    /// `other`'s sums (and marks) added into these.
    pub fn merge(&mut self, other: &Sums) {
        let values = self.values.iter_mut().zip(&other.values);
        values.for_each(|(t, s)| *t += s);
        let touched = self.touched.iter_mut().zip(&other.touched);
        touched.for_each(|(t, s)| *t |= s);
    }
}

impl RowIndex {
    /// The index of `rows` parameter rows with identity columns `keys`
    /// (their memory in `reservation` already); `check`'s typed error where
    /// two of them have one identity.
    pub fn build(
        keys: Vec<ArrayRef>,
        rows: usize,
        check: &Duplicate,
        reservation: MemoryReservation,
    ) -> Result<Self> {
        if rows >= NONE as usize {
            return fail(
                ErrorKind::UnsupportedType,
                format!(
                    "a gradient table of {rows} parameter rows; at most {} are supported",
                    NONE - 1
                ),
            );
        }
        let all: Vec<usize> = (0..keys.len()).collect();
        let integers: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&c| keys[c].data_type().is_integer())
            .collect();
        let mut lookup = numbered(&keys, all, rows, Some(check), &reservation)?;
        if lookup.is_none() && !integers.is_empty() && integers.len() < keys.len() {
            // Two rows with equal integer columns may still differ in the
            // others: no error, the hash table decides.
            lookup = numbered(&keys, integers, rows, None, &reservation)?;
        }
        let lookup = match lookup {
            Some(numbered) => numbered,
            None => hashed(&keys, rows, check, &reservation)?,
        };
        Ok(Self {
            keys,
            rows,
            lookup,
            reservation,
        })
    }

    /// Zero sums for every parameter row (and, with `touched`, a mark
    /// per row, none set), their memory taken from the pool.
    pub fn sums(&self, touched: bool) -> Result<Sums> {
        let words = match touched {
            true => self.rows.div_ceil(64),
            false => 0,
        };
        let reservation = self.reservation.new_empty();
        reservation.try_grow(self.rows * size_of::<f64>() + words * size_of::<u64>())?;
        Ok(Sums {
            values: vec![0.0; self.rows],
            touched: vec![0; words],
            _memory: reservation,
        })
    }

    /// Adds the contributions `batch` (identity columns, then the partial)
    /// into `sums`: each non-NULL partial to the row of its identity (none:
    /// it is dropped).
    pub fn add(&self, batch: &RecordBatch, sums: &mut Sums) -> Result<()> {
        let width = self.keys.len();
        let keys = &batch.columns()[..width];
        let Some(partials) = batch.column(width).as_primitive_opt::<Float64Type>() else {
            return internal_err!("a gradient table's contributions are doubles");
        };
        match &self.lookup {
            Lookup::Numbered {
                columns,
                low,
                high,
                stride,
                slots,
            } => {
                let keys = columns
                    .iter()
                    .map(|&c| cast(&keys[c], &DataType::Int64))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let keys: Vec<_> = keys.iter().map(|k| k.as_primitive::<Int64Type>()).collect();
                'rows: for i in 0..batch.num_rows() {
                    if partials.is_null(i) {
                        continue;
                    }
                    let mut slot = 0u64;
                    for (c, k) in keys.iter().enumerate() {
                        let v = k.value(i);
                        if k.is_null(i) || v < low[c] || v > high[c] {
                            continue 'rows;
                        }
                        slot += v.abs_diff(low[c]) * stride[c];
                    }
                    let row = slots[slot as usize];
                    if row != NONE {
                        sums.add(row as usize, partials.value(i));
                    }
                }
            }
            Lookup::Hashed {
                first,
                next,
                hashing,
            } => {
                let mut hashes = vec![0; batch.num_rows()];
                create_hashes(keys, hashing, &mut hashes)?;
                let same = comparators(keys, &self.keys)?;
                // A row's contributions tend to come one after another (a
                // join emits a probe row's matches together): the last row
                // found is tried before the table.
                let mut last = NONE;
                for (i, &h) in hashes.iter().enumerate() {
                    if partials.is_null(i) {
                        continue;
                    }
                    if last == NONE || !equal(&same, i, last as usize) {
                        last = first.get(&h).copied().unwrap_or(NONE);
                        while last != NONE && !equal(&same, i, last as usize) {
                            last = next[last as usize];
                        }
                        if last == NONE {
                            continue;
                        }
                    }
                    sums.add(last as usize, partials.value(i));
                }
            }
        }
        Ok(())
    }
}

/// The numbered lookup of the identity columns `columns` of `keys`, if
/// they are integers without NULLs whose ranges multiply to at most
/// [`SLOTS_PER_ROW`] slots per row and (without `check`, where they are not
/// the whole identity) tell the rows apart.
fn numbered(
    keys: &[ArrayRef],
    columns: Vec<usize>,
    rows: usize,
    check: Option<&Duplicate>,
    reservation: &MemoryReservation,
) -> Result<Option<Lookup>> {
    if rows == 0
        || columns
            .iter()
            .any(|&c| !keys[c].data_type().is_integer() || keys[c].null_count() > 0)
    {
        return Ok(None);
    }
    let keys = columns
        .iter()
        .map(|&c| cast(&keys[c], &DataType::Int64))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let keys: Vec<_> = keys.iter().map(|k| k.as_primitive::<Int64Type>()).collect();
    // an unsigned key above i64::MAX casts to NULL
    if keys.iter().any(|k| k.null_count() > 0) {
        return Ok(None);
    }
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut span: u128 = 1;
    for k in &keys {
        let (Some(l), Some(h)) = (min(*k), max(*k)) else {
            return Ok(None);
        };
        span *= u128::from(h.abs_diff(l)) + 1;
        if span > SLOTS_PER_ROW * rows as u128 {
            return Ok(None);
        }
        low.push(l);
        high.push(h);
    }
    let mut stride = vec![1u64; keys.len()];
    for c in (0..keys.len().saturating_sub(1)).rev() {
        stride[c] = stride[c + 1] * (high[c + 1].abs_diff(low[c + 1]) + 1);
    }
    let memory = reservation.new_empty();
    memory.try_grow(span as usize * size_of::<u32>())?;
    let mut slots = vec![NONE; span as usize];
    for row in 0..rows {
        let slot: u64 = (0..keys.len())
            .map(|c| keys[c].value(row).abs_diff(low[c]) * stride[c])
            .sum();
        let slot = &mut slots[slot as usize];
        if *slot != NONE {
            return match check {
                Some(check) => fail(check.kind, check.message.clone()),
                None => Ok(None),
            };
        }
        *slot = row as u32;
    }
    // Held as long as the index.
    let size = memory.free();
    reservation.try_grow(size)?;
    Ok(Some(Lookup::Numbered {
        columns,
        low,
        high,
        stride,
        slots,
    }))
}

/// The hashed lookup of `keys` (any types, NULLs equal).
fn hashed(
    keys: &[ArrayRef],
    rows: usize,
    check: &Duplicate,
    reservation: &MemoryReservation,
) -> Result<Lookup> {
    // the chains and the table (about twice its entries)
    reservation.try_grow(rows * (size_of::<u32>() + 2 * 16))?;
    let hashing = RandomState::with_seed(0);
    let mut hashes = vec![0; rows];
    create_hashes(keys, &hashing, &mut hashes)?;
    let same = comparators(keys, keys)?;
    let mut first: HashMap<u64, u32> = HashMap::with_capacity(rows);
    let mut next = vec![NONE; rows];
    for (i, &h) in hashes.iter().enumerate() {
        if let Some(&latest) = first.get(&h) {
            let mut j = latest;
            while j != NONE {
                if equal(&same, i, j as usize) {
                    return fail(check.kind, check.message.clone());
                }
                j = next[j as usize];
            }
            next[i] = latest;
        }
        first.insert(h, i as u32);
    }
    Ok(Lookup::Hashed {
        first,
        next,
        hashing,
    })
}

/// The comparators of `left`'s identity columns with `right`'s.
fn comparators(left: &[ArrayRef], right: &[ArrayRef]) -> Result<Vec<DynComparator>> {
    left.iter()
        .zip(right)
        .map(|(l, r)| {
            Ok(make_comparator(
                l.as_ref(),
                r.as_ref(),
                SortOptions::default(),
            )?)
        })
        .collect()
}

/// Whether row `i` of the left columns has the identity of row `j` of the
/// right ones (NULLs equal).
fn equal(comparators: &[DynComparator], i: usize, j: usize) -> bool {
    comparators.iter().all(|c| c(i, j).is_eq())
}
