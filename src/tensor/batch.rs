//! Whole-batch access to tensor arguments and results.
//!
//! A column of tensors is read as one flat row-major `f64` buffer (the child
//! buffer of its fixed-size lists), so kernels run over a whole batch without
//! a per-row allocation or per-row type dispatch. A constant argument is a
//! buffer of one value that every row reads (stride 0).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float64Array};
use datafusion::arrow::buffer::{NullBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::ColumnarValue;

use super::shape::Shape;
use crate::error::{fail, ErrorKind};

/// One argument of a tensor function over a batch.
#[derive(Debug, Clone)]
pub struct TensorArg {
    /// The shape of each row's value.
    pub shape: Shape,
    values: ScalarBuffer<f64>,
    stride: usize,
    nulls: Option<NullBuffer>,
}

impl TensorArg {
    /// Reads `value` (already cast to its canonical Float64 type) for a batch of `rows`.
    pub fn new(value: &ColumnarValue, rows: usize) -> Result<Self> {
        let (array, broadcast) = match value {
            ColumnarValue::Array(a) => (Arc::clone(a), false),
            ColumnarValue::Scalar(s) => (s.to_array_of_size(1)?, true),
        };
        let shape = Shape::of(array.data_type()).ok_or_else(|| {
            crate::error::GradError::new(
                ErrorKind::UnsupportedType,
                format!(
                    "a tensor function got a value of type {}",
                    array.data_type()
                ),
            )
        })?;
        let nulls = match (broadcast, array.logical_nulls()) {
            (true, Some(n)) if n.null_count() > 0 => Some(NullBuffer::new_null(rows)),
            (true, _) => None,
            (false, n) => n,
        };
        let values = flat_values(&array, shape, nulls.as_ref().filter(|_| !broadcast))?;
        Ok(Self {
            shape,
            values,
            stride: if broadcast { 0 } else { shape.size() },
            nulls,
        })
    }

    /// Row `i`'s elements.
    pub fn row(&self, i: usize) -> &[f64] {
        let start = self.stride * i;
        &self.values[start..start + self.shape.size()]
    }

    /// Row `i`'s value of a scalar argument.
    pub fn number(&self, i: usize) -> f64 {
        self.values[self.stride * i]
    }

    /// Every row's elements, back to back, when the argument is a column
    /// (not a constant read by every row).
    pub fn column(&self) -> Option<&[f64]> {
        (self.stride != 0).then_some(&self.values[..])
    }

    /// Which rows are SQL NULL.
    pub fn nulls(&self) -> Option<&NullBuffer> {
        self.nulls.as_ref()
    }
}

/// The flat `Float64` elements of `array`, whose rows have `shape`. Elements
/// under a NULL row are ignored; a NULL element in a non-NULL tensor is an error.
fn flat_values(
    array: &ArrayRef,
    shape: Shape,
    rows: Option<&NullBuffer>,
) -> Result<ScalarBuffer<f64>> {
    let mut leaf: ArrayRef = Arc::clone(array);
    while let DataType::FixedSizeList(..) = leaf.data_type() {
        leaf = Arc::clone(leaf.as_fixed_size_list().values());
    }
    let leaf = match leaf.data_type() {
        DataType::Float64 => leaf,
        _ => datafusion::arrow::compute::cast(&leaf, &DataType::Float64)?,
    };
    let leaf = leaf.as_primitive::<Float64Type>();
    if shape.is_tensor() && leaf.null_count() > 0 {
        let size = shape.size();
        let bad = leaf
            .nulls()
            .expect("null_count > 0")
            .iter()
            .enumerate()
            .any(|(j, valid)| !valid && rows.is_none_or(|r| r.is_valid(j / size)));
        if bad {
            return fail(
                ErrorKind::InvalidTensor,
                "a tensor has a NULL element; tensors must be NULL as a whole or hold numbers",
            );
        }
    }
    Ok(leaf.values().clone())
}

/// Which rows are NULL in any of `args`.
pub fn union_nulls(args: &[TensorArg]) -> Option<NullBuffer> {
    args.iter()
        .fold(None, |acc, a| NullBuffer::union(acc.as_ref(), a.nulls()))
}

/// The value of `shape` whose element `k` (row-major) is 1 and every other
/// 0: the `k`-th basis direction of a tensor variable.
///
/// ```
/// use datafusion_grad::tensor::{batch::unit, shape::Shape};
/// assert_eq!(unit(Shape::Vector(3), 1).unwrap().to_string(), "[0.0, 1.0, 0.0]");
/// ```
pub fn unit(shape: Shape, k: usize) -> Result<ScalarValue> {
    let mut values = vec![0.0; shape.size()];
    values[k] = 1.0;
    ScalarValue::try_from_array(&build(shape, values, None), 0)
}

/// A column of `shape` values from `values` (row after row) with `nulls`.
pub fn build(shape: Shape, values: Vec<f64>, nulls: Option<NullBuffer>) -> ArrayRef {
    let leaf = Arc::new(Float64Array::new(values.into(), None));
    match shape {
        Shape::Scalar => Arc::new(Float64Array::new(leaf.values().clone(), nulls)),
        Shape::Vector(n) => Arc::new(FixedSizeListArray::new(
            item(DataType::Float64),
            n as i32,
            leaf,
            nulls,
        )),
        Shape::Matrix(r, c) => {
            let rows = Arc::new(FixedSizeListArray::new(
                item(DataType::Float64),
                c as i32,
                leaf,
                None,
            ));
            Arc::new(FixedSizeListArray::new(
                item(Shape::Vector(c).data_type()),
                r as i32,
                rows,
                nulls,
            ))
        }
    }
}

fn item(t: DataType) -> Arc<Field> {
    Arc::new(Field::new_list_field(t, true))
}
