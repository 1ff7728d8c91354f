//! The scalar UDF behind every tensor function: one [`Spec`] per function
//! gives its documentation, its result shape and its batch kernel.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, DocSection, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl,
    Signature, Volatility,
};

use super::batch::{build, union_nulls, TensorArg};
use super::shape::{Shape, MAX_ELEMENTS};
use crate::error::{fail, ErrorKind};
use crate::options::Device;

/// What a kernel sees: the arguments over one batch and the result shape.
pub struct Batch {
    /// The arguments, in call order.
    pub args: Vec<TensorArg>,
    /// The shape of each result row.
    pub out: Shape,
    /// Number of rows.
    pub rows: usize,
    /// Literal arguments (e.g. `reshape`'s dimensions), by position.
    pub literals: Vec<Option<ScalarValue>>,
    /// Where matrix products may run (the session's
    /// `datafusion_grad.tensor_device`); other kernels ignore it.
    pub device: Device,
}

impl Batch {
    /// Whether row `i` is non-NULL in every argument.
    pub fn is_valid(&self, i: usize) -> bool {
        self.args
            .iter()
            .all(|a| a.nulls().is_none_or(|n| n.is_valid(i)))
    }

    /// Runs `f(row, args' rows, out row)` for each row into a new buffer.
    pub fn per_row(&self, mut f: impl FnMut(usize, &mut [f64])) -> Vec<f64> {
        let size = self.out.size();
        let mut out = vec![0.0; self.rows * size];
        for (i, row) in out
            .chunks_exact_mut(size.max(1))
            .enumerate()
            .take(self.rows)
        {
            f(i, row);
        }
        out
    }
}

/// The definition of one tensor function.
pub struct Spec {
    /// SQL name.
    pub name: &'static str,
    /// What it computes (documentation).
    pub description: &'static str,
    /// Call syntax, e.g. `matvec(m, v)`.
    pub syntax: &'static str,
    /// An SQL example.
    pub example: &'static str,
    /// Argument count accepted.
    pub arity: std::ops::RangeInclusive<usize>,
    /// The result shape for argument shapes and literal arguments.
    pub shape: fn(&[Shape], &[Option<&ScalarValue>]) -> Result<Shape>,
    /// The result over a batch: `rows × out.size()` values, row after row.
    pub eval: fn(&Batch) -> Result<Vec<f64>>,
}

/// A tensor function as a DataFusion scalar UDF.
#[derive(Debug)]
pub struct TensorFunction {
    spec: &'static Spec,
    signature: Signature,
    doc: OnceLock<Documentation>,
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl TensorFunction {
    /// The UDF for `spec`.
    pub fn new(spec: &'static Spec) -> Self {
        Self {
            spec,
            signature: Signature::user_defined(Volatility::Immutable),
            doc: OnceLock::new(),
        }
    }

    fn check_arity(&self, n: usize) -> Result<()> {
        if self.spec.arity.contains(&n) {
            return Ok(());
        }
        fail(
            ErrorKind::WrongArity,
            format!(
                "{} takes {:?} arguments, got {n}: {}",
                self.spec.name, self.spec.arity, self.spec.syntax
            ),
        )
    }
}

impl PartialEq for TensorFunction {
    fn eq(&self, other: &Self) -> bool {
        self.spec.name == other.spec.name
    }
}
impl Eq for TensorFunction {}
impl std::hash::Hash for TensorFunction {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.spec.name.hash(state)
    }
}

/// The shape of an argument of type `t`, or a typed error naming `function`.
pub fn arg_shape(function: &str, t: &DataType) -> Result<Shape> {
    Shape::of(t).ok_or_else(|| {
        let hint = match t {
            DataType::List(_) | DataType::LargeList(_) => {
                " (a list's length is not part of its type: make it a tensor with tensor(list, n) \
                 or tensor(list, rows, cols))"
            }
            _ => "",
        };
        crate::error::GradError::new(
            ErrorKind::UnsupportedType,
            format!(
                "{function} takes numbers and tensors (FixedSizeList of Float32/Float64, or of \
                 those lists), got {t}{hint}"
            ),
        )
        .into()
    })
}

impl ScalarUDFImpl for TensorFunction {
    fn name(&self) -> &str {
        self.spec.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.check_arity(arg_types.len())?;
        // Tensors become Float64 tensors; numbers keep their type (a literal
        // dimension must stay a literal; kernels read numbers as Float64).
        arg_types
            .iter()
            .map(|t| match arg_shape(self.spec.name, t)? {
                Shape::Scalar if t.is_numeric() => Ok(t.clone()),
                shape => Ok(shape.data_type()),
            })
            .collect()
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        unreachable!("return_field_from_args is implemented")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.check_arity(args.arg_fields.len())?;
        let shapes = args
            .arg_fields
            .iter()
            .map(|f| arg_shape(self.spec.name, f.data_type()))
            .collect::<Result<Vec<_>>>()?;
        let out = within_limit(
            self.spec.name,
            (self.spec.shape)(&shapes, args.scalar_arguments)?,
        )?;
        Ok(Arc::new(Field::new(self.spec.name, out.data_type(), true)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let literals = args
            .args
            .iter()
            .map(|a| match a {
                ColumnarValue::Scalar(s) => Some(s.clone()),
                ColumnarValue::Array(_) => None,
            })
            .collect();
        let tensors = args
            .args
            .iter()
            .map(|a| TensorArg::new(a, rows))
            .collect::<Result<Vec<_>>>()?;
        let out =
            Shape::of(args.return_field.data_type()).expect("a tensor function returns a shape");
        let batch = Batch {
            args: tensors,
            out,
            rows,
            literals,
            device: Device::of(&args.config_options),
        };
        let values = (self.spec.eval)(&batch)?;
        debug_assert_eq!(values.len(), rows * out.size());
        let nulls = union_nulls(&batch.args);
        Ok(ColumnarValue::Array(build(out, values, nulls)))
    }

    fn documentation(&self) -> Option<&Documentation> {
        let spec = self.spec;
        Some(self.doc.get_or_init(|| {
            Documentation::builder(
                DocSection {
                    include: true,
                    label: "Tensor Functions",
                    description: Some("Differentiable functions of vectors and matrices"),
                },
                spec.description,
                spec.syntax,
            )
            .with_sql_example(spec.example)
            .build()
        }))
    }
}

/// `labels` as 0-based class indices below `classes`, or an
/// `invalid_tensor` error of `function` naming the first that is not one.
pub fn class_indices(function: &str, labels: &[f64], classes: usize) -> Result<Vec<usize>> {
    labels
        .iter()
        .map(|&l| {
            if l >= 0.0 && l.fract() == 0.0 && (l as usize) < classes {
                Ok(l as usize)
            } else {
                fail(
                    ErrorKind::InvalidTensor,
                    format!("{function}: label {l} is not a class index in 0..{classes}"),
                )
            }
        })
        .collect()
}

/// A shape error of `function`.
pub fn mismatch<T>(function: &str, detail: impl std::fmt::Display) -> Result<T> {
    fail(ErrorKind::ShapeMismatch, format!("{function}: {detail}"))
}

/// `shape`, or a `shape_mismatch` error of `function` where one value of it
/// would have more than [`MAX_ELEMENTS`] elements.
pub fn within_limit(function: &str, shape: Shape) -> Result<Shape> {
    if shape.size() <= MAX_ELEMENTS {
        return Ok(shape);
    }
    mismatch(
        function,
        format!(
            "a {shape} has {} elements, over the limit of {MAX_ELEMENTS} elements (128 MiB) \
             per tensor value",
            shape.size()
        ),
    )
}
