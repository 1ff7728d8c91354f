//! Numbers for the distinct values of a few columns: the join keys and the
//! group keys of a contraction, numbered `0, 1, 2, …` in the order they are
//! first met, so the operator's tables are vectors indexed by number.
//!
//! One integer column (the usual id column) is numbered through a hash table
//! of its values; any other supported columns (several columns, strings,
//! `UInt64`) through their Arrow row encoding, whose equality is
//! DataFusion's for these types. A frozen numbering of integers spanning a
//! small range looks values up in a vector instead of the hash table.

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
        ids: HashMap<i64, u32>,
        /// The values in the order of their numbers (`None`: NULL).
        values: Vec<Option<i64>>,
        null: Option<u32>,
        /// After [`Numbering::freeze`], where the values span a small
        /// range: `slots[v - low]` is the number of `v` (`u32::MAX`: none).
        direct: Option<(i64, Vec<u32>)>,
    },
    /// Any supported columns, by their row encoding.
    Rows {
        converter: RowConverter,
        ids: HashMap<Box<[u8]>, u32>,
        /// The rows in the order of their numbers.
        rows: Rows,
    },
}

/// No number (a NULL join key, a key the build side does not have).
pub const NONE: u32 = u32::MAX;

impl Numbering {
    /// An empty numbering of columns of `types`.
    pub fn new(types: &[DataType], nulls: Nulls) -> Result<Self> {
        let by = match types {
            [t] if integer(t) => By::Integer {
                data_type: t.clone(),
                ids: HashMap::default(),
                values: Vec::new(),
                null: None,
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
            By::Rows { rows, .. } => rows.num_rows(),
        }
    }

    /// Whether no number has been given.
    pub fn is_empty(&self) -> bool {
        match &self.by {
            By::Integer { values, .. } => values.is_empty(),
            By::Rows { rows, .. } => rows.num_rows() == 0,
        }
    }

    /// The bytes the numbering holds, roughly (for the memory pool).
    pub fn size(&self) -> usize {
        match &self.by {
            By::Integer {
                ids,
                values,
                direct,
                ..
            } => {
                ids.capacity() * 16
                    + values.capacity() * 16
                    + direct.as_ref().map_or(0, |(_, d)| d.capacity() * 4)
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
                ids, values, null, ..
            } => {
                let column = as_i64(&columns[0])?;
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
                    out.push(*ids.entry(v).or_insert_with(|| {
                        values.push(Some(v));
                        values.len() as u32 - 1
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
        if let By::Integer {
            ids,
            values,
            direct,
            ..
        } = &mut self.by
        {
            let present = values.iter().flatten();
            let (Some(low), Some(high)) = (present.clone().min(), present.max()) else {
                return;
            };
            let span = (*high as i128 - *low as i128 + 1) as u128;
            if span <= 4 * values.len() as u128 + 1024 {
                let mut slots = vec![NONE; span as usize];
                for (&v, &id) in ids.iter() {
                    slots[(v - low) as usize] = id;
                }
                *direct = Some((*low, slots));
            }
        }
    }

    /// The number of each row of `columns` among those given, [`NONE`]
    /// where a row's value has none (or has a NULL, when unmatched).
    pub fn find(&self, columns: &[ArrayRef], out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        match &self.by {
            By::Integer {
                ids, null, direct, ..
            } => {
                let column = as_i64(&columns[0])?;
                let null = match self.nulls {
                    Nulls::Unmatched => NONE,
                    Nulls::Grouped => null.unwrap_or(NONE),
                };
                let has_nulls = column.null_count() > 0;
                let values = column.values();
                match direct {
                    Some((low, slots)) => out.extend(values.iter().enumerate().map(|(row, &v)| {
                        if has_nulls && column.is_null(row) {
                            return null;
                        }
                        let slot = (v as i128 - *low as i128) as u128;
                        match slot < slots.len() as u128 {
                            true => slots[slot as usize],
                            false => NONE,
                        }
                    })),
                    None => out.extend(values.iter().enumerate().map(|(row, v)| {
                        match has_nulls && column.is_null(row) {
                            true => null,
                            false => ids.get(v).copied().unwrap_or(NONE),
                        }
                    })),
                }
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
            By::Rows {
                converter, rows, ..
            } => Ok(converter.convert_rows(rows)?),
        }
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
