//! Making tensors: `tensor(list, dims…)` from SQL lists (`[1.0, 2.0]`,
//! `make_array`, `array_agg`), `reshape(t, dims…)`, `random_tensor(seed,
//! dims…)` and `one_hot(labels, classes)`.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, DocSection, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl,
    Signature, Volatility,
};

use super::batch::build;
use super::function::{class_indices, mismatch, within_limit, Spec};
use super::shape::Shape;
use crate::error::{fail, ErrorKind, GradError};

/// `reshape(t, n)` / `reshape(t, rows, cols)`.
pub static RESHAPE: Spec = Spec {
    name: "reshape",
    description: "The elements of a tensor, row-major, as a vector of n or an r×c matrix (the element count must not change).",
    syntax: "reshape(t, n) | reshape(t, rows, cols)",
    example: "SELECT reshape(tensor([1.0, 2.0, 3.0, 4.0], 4), 2, 2); -- [[1.0, 2.0], [3.0, 4.0]]",
    arity: 2..=3,
    shape: |s, literals| {
        let target = dims("reshape", &literals[1..])?;
        if target.size() != s[0].size() || !s[0].is_tensor() {
            return mismatch("reshape", format!("cannot reshape {} into {target}", s[0]));
        }
        Ok(target)
    },
    eval: |b| Ok(b.per_row(|i, out| out.copy_from_slice(b.args[0].row(i)))),
};

/// `random_tensor(seed, n)` / `random_tensor(seed, rows, cols)`.
pub static RANDOM_TENSOR: Spec = Spec {
    name: "random_tensor",
    description: "A tensor of pseudo-random numbers uniform in [-1, 1), a pure function of the seed (SplitMix64 of the seed and the element index): the same seed gives the same tensor on every engine run. Its derivative is 0.",
    syntax: "random_tensor(seed, n) | random_tensor(seed, rows, cols)",
    example: "SELECT random_tensor(42, 784, 20); -- initial weights",
    arity: 2..=3,
    shape: |s, literals| {
        if s[0] != Shape::Scalar {
            return mismatch("random_tensor", "the seed must be a number");
        }
        dims("random_tensor", &literals[1..])
    },
    eval: |b| {
        Ok(b.per_row(|i, out| {
            let seed = b.args[0].number(i).to_bits();
            for (j, o) in out.iter_mut().enumerate() {
                *o = uniform(seed, j as u64);
            }
        }))
    },
};

/// `one_hot(labels, classes)`.
pub static ONE_HOT: Spec = Spec {
    name: "one_hot",
    description: "One-hot encoding of 0-based class labels: a number gives a vector of `classes`, a vector of n labels an n×classes matrix. Its derivative is 0.",
    syntax: "one_hot(labels, classes)",
    example: "SELECT one_hot(tensor([2.0, 0.0], 2), 3); -- [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]",
    arity: 2..=2,
    shape: |s, literals| {
        let Shape::Vector(classes) = dims("one_hot", &literals[1..])? else {
            unreachable!("one dimension")
        };
        match s[0] {
            Shape::Scalar => Ok(Shape::Vector(classes)),
            Shape::Vector(n) => Ok(Shape::Matrix(n, classes)),
            m => mismatch("one_hot", format!("labels must be a number or a vector, got {m}")),
        }
    },
    eval: |b| {
        let (_, classes) = b.out.rows_cols();
        let mut out = vec![0.0; b.rows * b.out.size()];
        for (i, o) in out.chunks_exact_mut(b.out.size()).enumerate() {
            if !b.is_valid(i) {
                continue;
            }
            let labels = class_indices("one_hot", b.args[0].row(i), classes)?;
            for (row, l) in o.chunks_exact_mut(classes).zip(labels) {
                row[l] = 1.0;
            }
        }
        Ok(out)
    },
};

/// The `n` values of `random_tensor(seed, n)`: uniform in [-1, 1), a pure
/// function of `seed` (the data of the kernels' tests and benchmarks).
///
/// ```
/// use datafusion_grad::tensor::construct::random_values;
/// let v = random_values(1.0, 4);
/// assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
/// assert_eq!(v, random_values(1.0, 4));
/// ```
pub fn random_values(seed: f64, n: usize) -> Vec<f64> {
    (0..n as u64).map(|j| uniform(seed.to_bits(), j)).collect()
}

/// Element `index` of the stream of `seed`: SplitMix64, mapped to [-1, 1).
fn uniform(seed: u64, index: u64) -> f64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index.wrapping_add(1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// The shape given by literal dimension arguments (within
/// [`within_limit`]).
fn dims(function: &str, literals: &[Option<&ScalarValue>]) -> Result<Shape> {
    let mut ds = Vec::with_capacity(literals.len());
    for l in literals {
        match l.and_then(|v| v.cast_to(&DataType::Int64).ok()) {
            Some(ScalarValue::Int64(Some(d))) if d > 0 => {
                ds.push(usize::try_from(d).unwrap_or(usize::MAX))
            }
            Some(ScalarValue::Int64(Some(d))) => {
                return mismatch(function, format!("dimensions must be positive, got {d}"))
            }
            _ => {
                return mismatch(
                    function,
                    "dimensions must be integer literals (a tensor's shape is part of its type)",
                )
            }
        }
    }
    let shape = match ds[..] {
        [n] => Shape::Vector(n),
        [r, c] => Shape::Matrix(r, c),
        _ => return mismatch(function, "takes one or two dimensions"),
    };
    within_limit(function, shape)
}

/// `tensor(list, n)` / `tensor(list, rows, cols)`: a tensor from a list of
/// numbers (row-major) or a list of lists (one per row).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TensorConstructor {
    signature: Signature,
}

impl Default for TensorConstructor {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for TensorConstructor {
    fn name(&self) -> &str {
        "tensor"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if !(2..=3).contains(&arg_types.len()) {
            return fail(
                ErrorKind::WrongArity,
                format!(
                    "tensor(list, n) or tensor(list, rows, cols), got {} arguments",
                    arg_types.len()
                ),
            );
        }
        let list = match &arg_types[0] {
            t if is_list_of_numbers(t) => list_of_f64(t, 1)?,
            t if list_item(t).is_some_and(is_list_of_numbers) => list_of_f64(t, 2)?,
            t => {
                return fail(
                    ErrorKind::UnsupportedType,
                    format!(
                        "tensor() takes a list of numbers or a list of lists of numbers, got {t}"
                    ),
                )
            }
        };
        let mut out = vec![list];
        out.extend(arg_types[1..].iter().map(|_| DataType::Int64));
        Ok(out)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        unreachable!("return_field_from_args is implemented")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let shape = dims("tensor", &args.scalar_arguments[1..])?;
        Ok(Arc::new(Field::new("tensor", shape.data_type(), true)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let shape = Shape::of(args.return_field.data_type()).expect("tensor returns a tensor");
        let list = args.args[0].to_array(args.number_rows)?;
        let size = shape.size();
        let rows = list.len();
        let mut values = Vec::with_capacity(rows * size);
        let nulls = list.logical_nulls();
        for i in 0..rows {
            if nulls.as_ref().is_some_and(|n| n.is_null(i)) {
                values.extend(std::iter::repeat_n(0.0, size));
                continue;
            }
            let before = values.len();
            flatten_row(list.as_ref(), i, shape, &mut values)?;
            if values.len() - before != size {
                return fail(
                    ErrorKind::ShapeMismatch,
                    format!(
                        "tensor(): row {i} has {} elements, the shape {shape} needs {size}",
                        values.len() - before
                    ),
                );
            }
        }
        let nulls = nulls.filter(|n: &NullBuffer| n.null_count() > 0);
        Ok(ColumnarValue::Array(build(shape, values, nulls)))
    }

    fn documentation(&self) -> Option<&Documentation> {
        static DOC: OnceLock<Documentation> = OnceLock::new();
        Some(DOC.get_or_init(|| {
            Documentation::builder(
                DocSection {
                    include: true,
                    label: "Tensor Functions",
                    description: Some("Differentiable functions of vectors and matrices"),
                },
                "A tensor (FixedSizeList of Float64) from a list of numbers, row-major, or a list \
                 of rows; the shape is given by literal dimensions and checked on every row.",
                "tensor(list, n) | tensor(list, rows, cols)",
            )
            .with_sql_example(
                "SELECT tensor([1.0, 2.0, 3.0, 4.0], 2, 2); -- [[1.0, 2.0], [3.0, 4.0]]",
            )
            .build()
        }))
    }
}

/// Appends row `i` of the list column `list` (a list of Float64, or of lists
/// of them, after coercion), checking each inner row's length against `shape`.
fn flatten_row(list: &dyn Array, i: usize, shape: Shape, values: &mut Vec<f64>) -> Result<()> {
    let row = list_value(list, i);
    if let Some(leaf) = row.as_primitive_opt::<Float64Type>() {
        return push_numbers(leaf, values);
    }
    let (_, cols) = shape.rows_cols();
    for j in 0..row.len() {
        if row.is_null(j) {
            return fail(
                ErrorKind::InvalidTensor,
                "tensor(): a row of the matrix is NULL",
            );
        }
        let inner = list_value(row.as_ref(), j);
        if inner.len() != cols {
            return mismatch(
                "tensor",
                format!(
                    "a matrix row has {} elements, the shape {shape} needs {cols}",
                    inner.len()
                ),
            );
        }
        push_numbers(inner.as_primitive::<Float64Type>(), values)?;
    }
    Ok(())
}

fn push_numbers(
    leaf: &datafusion::arrow::array::Float64Array,
    values: &mut Vec<f64>,
) -> Result<()> {
    if leaf.null_count() > 0 {
        return fail(
            ErrorKind::InvalidTensor,
            "tensor(): the list has a NULL element",
        );
    }
    values.extend_from_slice(leaf.values());
    Ok(())
}

/// Element `i` of a List, LargeList or FixedSizeList array.
fn list_value(list: &dyn Array, i: usize) -> Arc<dyn Array> {
    match list.data_type() {
        DataType::List(_) => list.as_list::<i32>().value(i),
        DataType::LargeList(_) => list.as_list::<i64>().value(i),
        _ => list.as_fixed_size_list().value(i),
    }
}

fn list_item(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            Some(f.data_type())
        }
        _ => None,
    }
}

fn is_list_of_numbers(t: &DataType) -> bool {
    list_item(t).is_some_and(|i| i.is_numeric() || *i == DataType::Null)
}

/// `t` (a list, `depth` levels deep) with Float64 leaves.
fn list_of_f64(t: &DataType, depth: usize) -> Result<DataType> {
    if depth == 0 {
        return Ok(DataType::Float64);
    }
    let item =
        list_item(t).ok_or_else(|| GradError::new(ErrorKind::UnsupportedType, "not a list"))?;
    let inner = Arc::new(Field::new_list_field(list_of_f64(item, depth - 1)?, true));
    Ok(match t {
        DataType::LargeList(_) => DataType::LargeList(inner),
        DataType::FixedSizeList(_, n) => DataType::FixedSizeList(inner, *n),
        _ => DataType::List(inner),
    })
}
