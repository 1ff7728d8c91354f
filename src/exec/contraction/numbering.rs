//! Numbers for the distinct values of a few columns: the join keys and the
//! group keys of a contraction, numbered `0, 1, 2, …` in the order they are
//! first met, so the operator's tables are vectors indexed by number.
//!
//! One integer column (the usual id column) is numbered through a vector
//! indexed by value for small non-negative values (ids `0, 1, 2, …`, grown
//! while the values it covers stay few beside the values numbered) and a
//! hash table of the other values; several integer columns (a composite
//! id) through one of their tuples of values (up to four columns); any
//! other supported columns (strings, `UInt64`) through their Arrow row
//! encoding, whose equality is DataFusion's for these types. A frozen
//! numbering of integers spanning a small range looks every value up in a
//! vector instead of the hash table. A row whose values are the row's
//! before it (a join's output repeats its probe row's) takes its number
//! without a lookup.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::{internal_err, HashMap};
use datafusion::error::Result;

/// Whether values of `data_type` can be numbered: equality of their row
/// encoding (or of their integer value) is SQL equality, with no value
/// equal to another that is written differently (unlike floats' `-0.0`).
pub fn supported(data_type: &DataType) -> bool {
    integer(data_type)
        || matches!(
            data_type,
            DataType::UInt64 | DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        )
}

/// Integer types whose every value is an `i64`.
fn integer(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
    )
}

/// What a row with a NULL among its columns gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nulls {
    /// No number: NULL never equals anything (join keys).
    Unmatched,
    /// A number like any value: NULLs form one group (`GROUP BY`).
    Grouped,
}

/// The numbers given so far; see the [module docs](self).
#[derive(Debug)]
pub struct Numbering {
    nulls: Nulls,
    by: By,
}

#[derive(Debug)]
enum By {
    /// One integer column, as `i64`.
    Integer {
        data_type: DataType,
        /// The values numbered through a vector (see [`Slots`]); never in
        /// `ids`.
        slots: Slots,
        /// The numbers of the values that `slots` does not cover.
        ids: HashMap<i64, u32>,
        /// The values in the order of their numbers (`None`: NULL).
        values: Vec<Option<i64>>,
        null: Option<u32>,
    },
    /// Two to [`TUPLE`]` - 1` integer columns, as tuples of `i64`: per row,
    /// a mask of its NULL columns, then each column's value (0 where NULL
    /// and after the last column).
    Integers {
        types: Vec<DataType>,
        ids: HashMap<[i64; TUPLE], u32>,
        /// The tuples in the order of their numbers, one after another.
        values: Vec<i64>,
        /// After [`Numbering::freeze`], where no tuple has a NULL and the
        /// columns' values span a small box: the tuple `v` is at
        /// `slots[Σ (v_c - low_c) · stride_c]`.
        direct: Option<Box<Grid>>,
    },
    /// Any supported columns, by their row encoding.
    Rows {
        converter: RowConverter,
        ids: HashMap<Box<[u8]>, u32>,
        /// The rows in the order of their numbers.
        rows: Rows,
    },
}

/// The length of a tuple of integer columns (see `By::Integers`): a NULL
/// mask and up to four values.
const TUPLE: usize = 5;

/// No number (a NULL join key, a key the build side does not have).
pub const NONE: u32 = u32::MAX;

impl Numbering {
    /// An empty numbering of columns of `types`.
    pub fn new(types: &[DataType], nulls: Nulls) -> Result<Self> {
        let by = match types {
            [t] if integer(t) => By::Integer {
                data_type: t.clone(),
                slots: Slots::default(),
                ids: HashMap::default(),
                values: Vec::new(),
                null: None,
            },
            _ if types.len() < TUPLE && types.iter().all(integer) => By::Integers {
                types: types.to_vec(),
                ids: HashMap::default(),
                values: Vec::new(),
                direct: None,
            },
            _ => {
                let fields = types.iter().map(|t| SortField::new(t.clone())).collect();
                let converter = RowConverter::new(fields)?;
                let rows = converter.empty_rows(0, 0);
                By::Rows {
                    converter,
                    ids: HashMap::default(),
                    rows,
                }
            }
        };
        Ok(Self { nulls, by })
    }

    /// How many numbers have been given.
    pub fn len(&self) -> usize {
        match &self.by {
            By::Integer { values, .. } => values.len(),
            By::Integers { types, values, .. } => values.len() / (types.len() + 1),
            By::Rows { rows, .. } => rows.num_rows(),
        }
    }

    /// Whether no number has been given.
    pub fn is_empty(&self) -> bool {
        match &self.by {
            By::Integer { values, .. } => values.is_empty(),
            By::Integers { values, .. } => values.is_empty(),
            By::Rows { rows, .. } => rows.num_rows() == 0,
        }
    }

    /// The bytes the numbering holds, roughly (for the memory pool).
    pub fn size(&self) -> usize {
        match &self.by {
            By::Integer {
                slots, ids, values, ..
            } => slots.numbers.capacity() * 4 + ids.capacity() * 16 + values.capacity() * 16,
            By::Integers {
                ids,
                values,
                direct,
                ..
            } => {
                ids.capacity() * (8 * TUPLE + 5)
                    + values.capacity() * 8
                    + direct.as_ref().map_or(0, |d| d.slots.capacity() * 4)
            }
            By::Rows { ids, rows, .. } => ids.capacity() * 24 + 2 * rows.size(),
        }
    }

    /// The number of each row of `columns`, giving new values the next
    /// numbers ([`NONE`] for a row with a NULL when NULLs are unmatched).
    pub fn number(&mut self, columns: &[ArrayRef], out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        let nulls = self.nulls;
        match &mut self.by {
            By::Integer {
                slots,
                ids,
                values,
                null,
                ..
            } => {
                let column = as_i64(&columns[0])?;
                out.reserve(column.len());
                // The last value numbered: rows of one key tend to come
                // together (a matrix's rows), and a repeat needs no lookup.
                let mut last: Option<(i64, u32)> = None;
                for row in 0..column.len() {
                    if column.is_null(row) {
                        out.push(match nulls {
                            Nulls::Unmatched => NONE,
                            Nulls::Grouped => *null.get_or_insert_with(|| {
                                values.push(None);
                                values.len() as u32 - 1
                            }),
                        });
                        continue;
                    }
                    let v = column.value(row);
                    let id = match last {
                        Some((value, id)) if value == v => id,
                        _ => {
                            if slots.grows_to(v, values.len()) {
                                slots.grow(ids, v);
                            }
                            let next = values.len() as u32;
                            let id = match slots.get_mut(v) {
                                Some(slot) => {
                                    if *slot == NONE {
                                        *slot = next;
                                    }
                                    *slot
                                }
                                None => *ids.entry(v).or_insert(next),
                            };
                            if id == next {
                                values.push(Some(v));
                            }
                            id
                        }
                    };
                    last = Some((v, id));
                    out.push(id);
                }
            }
            By::Integers { ids, values, .. } => {
                let tuples = Tuples::of(columns)?;
                let width = tuples.columns.len() + 1;
                for row in 0..tuples.rows {
                    if row > 0 && tuples.repeats(row) {
                        out.push(out[row - 1]);
                        continue;
                    }
                    let Some(tuple) = tuples.read(row, nulls) else {
                        out.push(NONE);
                        continue;
                    };
                    out.push(*ids.entry(tuple).or_insert_with(|| {
                        values.extend_from_slice(&tuple[..width]);
                        (values.len() / width) as u32 - 1
                    }));
                }
            }
            By::Rows {
                converter,
                ids,
                rows,
            } => {
                let encoded = converter.convert_columns(columns)?;
                for row in 0..encoded.num_rows() {
                    if nulls == Nulls::Unmatched && columns.iter().any(|c| c.is_null(row)) {
                        out.push(NONE);
                        continue;
                    }
                    let bytes = encoded.row(row);
                    let id = match ids.get(bytes.as_ref()) {
                        Some(&id) => id,
                        None => {
                            let id = rows.num_rows() as u32;
                            rows.push(bytes);
                            ids.insert(bytes.as_ref().into(), id);
                            id
                        }
                    };
                    out.push(id);
                }
            }
        }
        Ok(())
    }

    /// No more numbers will be given: integers spanning a small range are
    /// then looked up directly.
    pub fn freeze(&mut self) {
        match &mut self.by {
            By::Integer {
                slots, ids, values, ..
            } => {
                // (where `slots` hold every value already, nothing to do)
                if ids.is_empty() {
                    return;
                }
                let present = values.iter().flatten();
                let (Some(&low), Some(&high)) = (present.clone().min(), present.max()) else {
                    return;
                };
                let span = (high as i128 - low as i128 + 1) as u128;
                if span <= 4 * values.len() as u128 + 1024 {
                    let mut numbers = vec![NONE; span as usize];
                    for (id, v) in values.iter().enumerate() {
                        if let Some(v) = v {
                            numbers[(v - low) as usize] = id as u32;
                        }
                    }
                    *slots = Slots { low, numbers };
                    *ids = HashMap::default();
                }
            }
            By::Integers {
                types,
                values,
                direct,
                ..
            } => *direct = Grid::of(values, types.len()).map(Box::new),
            By::Rows { .. } => {}
        }
    }

    /// The number of each row of `columns` among those given, [`NONE`]
    /// where a row's value has none (or has a NULL, when unmatched).
    pub fn find(&self, columns: &[ArrayRef], out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        match &self.by {
            By::Integer {
                slots, ids, null, ..
            } => {
                let column = as_i64(&columns[0])?;
                let null = match self.nulls {
                    Nulls::Unmatched => NONE,
                    Nulls::Grouped => null.unwrap_or(NONE),
                };
                let has_nulls = column.null_count() > 0;
                let values = column.values();
                let hashed = !ids.is_empty();
                out.extend(values.iter().enumerate().map(|(row, &v)| {
                    if has_nulls && column.is_null(row) {
                        return null;
                    }
                    match slots.get(v) {
                        Some(id) => id,
                        None if hashed => ids.get(&v).copied().unwrap_or(NONE),
                        None => NONE,
                    }
                }));
            }
            By::Integers {
                direct: Some(grid), ..
            } => {
                let tuples = Tuples::of(columns)?;
                out.extend((0..tuples.rows).map(|row| grid.find(&tuples, row)));
            }
            By::Integers { ids, .. } => {
                let tuples = Tuples::of(columns)?;
                out.extend(
                    (0..tuples.rows).map(|row| match tuples.read(row, self.nulls) {
                        Some(tuple) => ids.get(&tuple).copied().unwrap_or(NONE),
                        None => NONE,
                    }),
                );
            }
            By::Rows { converter, ids, .. } => {
                let encoded = converter.convert_columns(columns)?;
                for row in 0..encoded.num_rows() {
                    if self.nulls == Nulls::Unmatched && columns.iter().any(|c| c.is_null(row)) {
                        out.push(NONE);
                        continue;
                    }
                    let bytes = encoded.row(row);
                    out.push(ids.get(bytes.as_ref()).copied().unwrap_or(NONE));
                }
            }
        }
        Ok(())
    }

    /// The numbered values, one row per number, as columns of the types
    /// numbered.
    pub fn values(&self) -> Result<Vec<ArrayRef>> {
        match &self.by {
            By::Integer {
                data_type, values, ..
            } => {
                let column: ArrayRef = Arc::new(Int64Array::from(values.clone()));
                Ok(vec![cast(&column, data_type)?])
            }
            By::Integers { types, values, .. } => {
                let width = types.len() + 1;
                let tuples = values.chunks_exact(width);
                let mut columns = Vec::with_capacity(types.len());
                for (c, data_type) in types.iter().enumerate() {
                    let column: Int64Array = tuples
                        .clone()
                        .map(|t| (t[0] & (1 << c) == 0).then_some(t[c + 1]))
                        .collect();
                    columns.push(cast(&(Arc::new(column) as ArrayRef), data_type)?);
                }
                Ok(columns)
            }
            By::Rows {
                converter, rows, ..
            } => Ok(converter.convert_rows(rows)?),
        }
    }
}

/// The numbers of the integers `low, low + 1, …` (see [`By::Integer`]):
/// `numbers[v - low]` is the number of `v` ([`NONE`]: none yet). While
/// values are numbered `low` is 0 and the vector grows (to powers of two)
/// while the values it covers stay few beside the numbers given; a frozen
/// numbering spanning a small range moves all its values here.
#[derive(Debug, Default)]
struct Slots {
    low: i64,
    numbers: Vec<u32>,
}

impl Slots {
    /// Where `v`'s number lies in `numbers`, if they cover it.
    #[inline]
    fn index(&self, v: i64) -> Option<usize> {
        covered(self.low, self.numbers.len(), v)
    }

    #[inline]
    fn get(&self, v: i64) -> Option<u32> {
        self.index(v).map(|i| self.numbers[i])
    }

    #[inline]
    fn get_mut(&mut self, v: i64) -> Option<&mut u32> {
        self.index(v).map(|i| &mut self.numbers[i])
    }

    /// Whether the slots should grow to cover `v` when `count` numbers
    /// have been given: `v` lies above them, and the values covered would
    /// stay few beside the numbers.
    #[inline]
    fn grows_to(&self, v: i64, count: usize) -> bool {
        let offset = v as i128 - self.low as i128;
        offset >= self.numbers.len() as i128
            && offset < 1 << 30
            && offset < 4 * count as i128 + 1024
    }

    /// Grown to cover `v` (to a power of two), the values of `ids` now
    /// covered moved in.
    fn grow(&mut self, ids: &mut HashMap<i64, u32>, v: i64) {
        let len = ((v - self.low) as usize + 1).next_power_of_two();
        self.numbers.resize(len, NONE);
        let (low, numbers) = (self.low, &mut self.numbers);
        ids.retain(|&k, &mut id| match covered(low, len, k) {
            Some(i) => {
                numbers[i] = id;
                false
            }
            None => true,
        });
    }
}

/// The place of `v` among `len` slots from `low`, if they cover it.
#[inline]
fn covered(low: i64, len: usize, v: i64) -> Option<usize> {
    let offset = (v as i128 - low as i128) as u128;
    (offset < len as u128).then_some(offset as usize)
}

/// A frozen numbering of tuples of integers as a grid of slots (see
/// [`By::Integers`]).
#[derive(Debug)]
struct Grid {
    /// Per column, its lowest value and its span.
    low: Vec<i64>,
    span: Vec<u64>,
    /// Per column, how far apart its consecutive values' slots lie.
    stride: Vec<u64>,
    slots: Vec<u32>,
}

impl Grid {
    /// The grid of the `width`-column tuples `values` (each after its NULL
    /// mask), `None` where one has a NULL or they would leave most slots
    /// empty.
    fn of(values: &[i64], width: usize) -> Option<Grid> {
        let tuples = values.chunks_exact(width + 1);
        let count = tuples.len();
        if count == 0 || tuples.clone().any(|t| t[0] != 0) {
            return None;
        }
        let (mut low, mut span, mut stride) = (vec![], vec![], vec![]);
        let mut size: u128 = 1;
        for c in 1..=width {
            let column = tuples.clone().map(|t| t[c]);
            let (lo, hi) = (column.clone().min()?, column.max()?);
            let s = (hi as i128 - lo as i128 + 1) as u128;
            stride.push(size as u64);
            size = size.checked_mul(s)?;
            if size > 4 * count as u128 + 1024 {
                return None;
            }
            low.push(lo);
            span.push(s as u64);
        }
        let mut slots = vec![NONE; size as usize];
        for (id, t) in tuples.enumerate() {
            let mut at = 0;
            for c in 0..width {
                at += (t[c + 1] - low[c]) as u64 * stride[c];
            }
            slots[at as usize] = id as u32;
        }
        Some(Grid {
            low,
            span,
            stride,
            slots,
        })
    }

    /// The number of row `row` of `tuples` ([`NONE`] for a NULL: no tuple
    /// numbered has one).
    #[inline]
    fn find(&self, tuples: &Tuples, row: usize) -> u32 {
        let mut at = 0;
        for (c, column) in tuples.columns.iter().enumerate() {
            if tuples.nullable && column.is_null(row) {
                return NONE;
            }
            let offset = (column.value(row) as i128 - self.low[c] as i128) as u128;
            if offset >= self.span[c] as u128 {
                return NONE;
            }
            at += offset as u64 * self.stride[c];
        }
        self.slots[at as usize]
    }
}

/// Several integer columns read as tuples (see [`By::Integers`]).
struct Tuples {
    columns: Vec<Int64Array>,
    rows: usize,
    nullable: bool,
}

impl Tuples {
    fn of(columns: &[ArrayRef]) -> Result<Self> {
        let columns = columns.iter().map(as_i64).collect::<Result<Vec<_>>>()?;
        let nullable = columns.iter().any(|c| c.null_count() > 0);
        let rows = columns.first().map_or(0, Array::len);
        Ok(Self {
            columns,
            rows,
            nullable,
        })
    }

    /// Whether row `row` has the values (and NULLs) of the row before it.
    #[inline]
    fn repeats(&self, row: usize) -> bool {
        self.columns.iter().all(|c| match self.nullable {
            true => match (c.is_null(row), c.is_null(row - 1)) {
                (false, false) => c.value(row) == c.value(row - 1),
                (a, b) => a && b,
            },
            false => c.value(row) == c.value(row - 1),
        })
    }

    /// Row `row`'s tuple; `None` where it has a NULL and NULLs are
    /// unmatched.
    #[inline]
    fn read(&self, row: usize, nulls: Nulls) -> Option<[i64; TUPLE]> {
        let mut tuple = [0; TUPLE];
        for (c, column) in self.columns.iter().enumerate() {
            match self.nullable && column.is_null(row) {
                true if nulls == Nulls::Unmatched => return None,
                true => tuple[0] |= 1 << c,
                false => tuple[c + 1] = column.value(row),
            }
        }
        Some(tuple)
    }
}

/// An integer column as `Int64` (every value fits: see [`integer`]).
fn as_i64(column: &ArrayRef) -> Result<Int64Array> {
    let column = match column.data_type() {
        DataType::Int64 => Arc::clone(column),
        t if integer(t) => cast(column, &DataType::Int64)?,
        t => return internal_err!("an integer numbering of a {t} column"),
    };
    Ok(column.as_primitive::<Int64Type>().clone())
}
