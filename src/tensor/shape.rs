//! Tensor shapes and the Arrow types that carry them.
//!
//! A vector of `n` numbers is `FixedSizeList<Float64, n>`; a matrix of `r`
//! rows and `c` columns is `FixedSizeList<FixedSizeList<Float64, c>, r>`
//! (row-major, one contiguous child buffer). `Float32` elements are accepted
//! as input and computed in `Float64`; every tensor function returns the
//! canonical `Float64` type, with list fields named `item` as DataFusion's
//! own array functions do.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};

/// Most elements one tensor value (one row's vector or matrix) may have:
/// 2^24 (128 MiB of Float64), e.g. a 4096 x 4096 matrix. A tensor function
/// whose result would be larger is refused while planning, before anything
/// is allocated.
pub const MAX_ELEMENTS: usize = 1 << 24;

/// The shape of a value a tensor function takes or returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// One number.
    Scalar,
    /// A vector of this many numbers.
    Vector(usize),
    /// A matrix of this many rows and columns.
    Matrix(usize, usize),
}

impl Shape {
    /// The shape of values of type `t`: numbers are scalars, fixed-size lists
    /// of floats are vectors, fixed-size lists of those are matrices.
    pub fn of(t: &DataType) -> Option<Shape> {
        match t {
            t if t.is_numeric() || *t == DataType::Null => Some(Shape::Scalar),
            DataType::FixedSizeList(item, n) => match (Shape::of(item.data_type())?, *n) {
                (Shape::Scalar, n) if is_float(item.data_type()) => Some(Shape::Vector(n as usize)),
                (Shape::Vector(c), r) => Some(Shape::Matrix(r as usize, c)),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether `t` is a tensor type (a vector or a matrix).
    pub fn is_tensor_type(t: &DataType) -> bool {
        matches!(Shape::of(t), Some(Shape::Vector(_) | Shape::Matrix(..)))
    }

    /// The canonical (Float64) Arrow type of values of this shape.
    pub fn data_type(self) -> DataType {
        match self {
            Shape::Scalar => DataType::Float64,
            Shape::Vector(n) => list_of(DataType::Float64, n),
            Shape::Matrix(r, c) => list_of(list_of(DataType::Float64, c), r),
        }
    }

    /// Number of elements.
    pub fn size(self) -> usize {
        match self {
            Shape::Scalar => 1,
            Shape::Vector(n) => n,
            Shape::Matrix(r, c) => r.saturating_mul(c),
        }
    }

    /// Whether this is a vector or a matrix.
    pub fn is_tensor(self) -> bool {
        self != Shape::Scalar
    }

    /// Rows and columns, a vector counting as one row (the last axis is the
    /// one `softmax`, `logsumexp` and `cross_entropy` work along).
    pub fn rows_cols(self) -> (usize, usize) {
        match self {
            Shape::Scalar => (1, 1),
            Shape::Vector(n) => (1, n),
            Shape::Matrix(r, c) => (r, c),
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Scalar => write!(f, "scalar"),
            Shape::Vector(n) => write!(f, "vector[{n}]"),
            Shape::Matrix(r, c) => write!(f, "matrix[{r}x{c}]"),
        }
    }
}

/// `FixedSizeList<item, n>` with a nullable field named `item`.
fn list_of(item: DataType, n: usize) -> DataType {
    DataType::FixedSizeList(Arc::new(Field::new_list_field(item, true)), n as i32)
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}
