//! `tensor_sum` and `tensor_avg`: elementwise sums and means of tensors over
//! rows (e.g. to average per-example gradients), NULL rows skipped.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, UInt64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDFImpl, ColumnarValue, DocSection, Documentation, Signature, Volatility,
};

use super::batch::{build, TensorArg};
use super::function::arg_shape;
use super::kernels;
use super::shape::Shape;
use crate::error::{fail, ErrorKind};

/// An elementwise aggregate of tensors: their sum, or their mean.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TensorAggregate {
    mean: bool,
    signature: Signature,
}

impl TensorAggregate {
    /// `tensor_sum`.
    pub fn sum() -> Self {
        Self::new(false)
    }

    /// `tensor_avg`.
    pub fn avg() -> Self {
        Self::new(true)
    }

    fn new(mean: bool) -> Self {
        Self {
            mean,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for TensorAggregate {
    fn name(&self) -> &str {
        if self.mean {
            "tensor_avg"
        } else {
            "tensor_sum"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.len() != 1 {
            return fail(
                ErrorKind::WrongArity,
                format!("{} takes one tensor argument", self.name()),
            );
        }
        let shape = arg_shape(self.name(), &arg_types[0])?;
        if !shape.is_tensor() {
            return fail(
                ErrorKind::UnsupportedType,
                format!(
                    "{} aggregates tensors; use sum/avg for numbers",
                    self.name()
                ),
            );
        }
        Ok(vec![shape.data_type()])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(arg_shape(self.name(), &arg_types[0])?.data_type())
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let shape =
            Shape::of(args.return_field.data_type()).expect("a tensor aggregate returns a tensor");
        Ok(Box::new(TensorAccumulator {
            mean: self.mean,
            shape,
            sum: vec![0.0; shape.size()],
            count: 0,
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![
            Arc::new(Field::new(
                format!("{}_sum", args.name),
                args.return_type().clone(),
                true,
            )),
            Arc::new(Field::new(
                format!("{}_count", args.name),
                DataType::UInt64,
                false,
            )),
        ])
    }

    fn documentation(&self) -> Option<&Documentation> {
        static DOCS: [OnceLock<Documentation>; 2] = [OnceLock::new(), OnceLock::new()];
        let (what, example) = if self.mean {
            (
                "mean",
                "SELECT tensor_avg(grad(cross_entropy(matvec(w, x), label), w)) FROM data, params;",
            )
        } else {
            ("sum", "SELECT tensor_sum(tensor([x, 1.0], 2)) FROM t;")
        };
        Some(DOCS[usize::from(self.mean)].get_or_init(|| {
            Documentation::builder(
                DocSection {
                    include: true,
                    label: "Tensor Functions",
                    description: Some("Differentiable functions of vectors and matrices"),
                },
                format!("The elementwise {what} of the tensors of a group; NULL rows are skipped, NULL for none."),
                format!("{}(t)", self.name()),
            )
            .with_sql_example(example)
            .build()
        }))
    }
}

#[derive(Debug)]
struct TensorAccumulator {
    mean: bool,
    shape: Shape,
    sum: Vec<f64>,
    count: u64,
}

impl TensorAccumulator {
    /// Adds the non-NULL rows of `values` to the sum.
    fn add(&mut self, values: &ArrayRef) -> Result<u64> {
        let arg = TensorArg::new(&ColumnarValue::Array(Arc::clone(values)), values.len())?;
        let mut n = 0;
        for i in 0..values.len() {
            if arg.nulls().is_none_or(|m| m.is_valid(i)) {
                kernels::axpy(1.0, arg.row(i), &mut self.sum);
                n += 1;
            }
        }
        Ok(n)
    }
}

impl Accumulator for TensorAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.count += self.add(&values[0])?;
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.add(&states[0])?;
        self.count += states[1]
            .as_primitive::<UInt64Type>()
            .values()
            .iter()
            .sum::<u64>();
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let sum = if self.count == 0 {
            ScalarValue::try_from(self.shape.data_type())?
        } else {
            ScalarValue::try_from_array(&build(self.shape, self.sum.clone(), None), 0)?
        };
        Ok(vec![sum, ScalarValue::UInt64(Some(self.count))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        if self.count == 0 {
            return ScalarValue::try_from(self.shape.data_type());
        }
        let mut values = self.sum.clone();
        if self.mean {
            let n = self.count as f64;
            values.iter_mut().for_each(|v| *v /= n);
        }
        ScalarValue::try_from_array(&build(self.shape, values, None), 0)
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + 8 * self.sum.capacity()
    }
}
