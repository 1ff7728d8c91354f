//! The SQL functions `grad`, `jvp` and `vjp`: scalar UDFs that rewrite
//! themselves into their derivative in [`ScalarUDFImpl::simplify`].
//!
//! Each row is an evaluation point, so `grad(f, x)` is the relational form of
//! `vmap(grad(f))`.
//!
//! ```sql
//! -- ∂/∂x of x²·y at every row: 2·x·y
//! SELECT grad(x * x * y, x) FROM t;
//! -- all partials in one reverse sweep, as a struct named after the columns
//! SELECT grad(x * x * y, x, y)['y'] FROM t;
//! -- forward mode: directional derivative along (1, 2)
//! SELECT jvp(x * y, x, 1.0, y, 2.0) FROM t;
//! -- reverse mode with a cotangent
//! SELECT vjp(sin(x), x, 3.0) FROM t;
//! -- higher order by nesting: ∂²/∂x² sin(x) = -sin(x)
//! SELECT grad(grad(sin(x), x), x) FROM t;
//! -- with respect to a prepared statement's parameter
//! PREPARE q(DOUBLE) AS SELECT grad(avg(power(x * $1 - y, 2)), $1) FROM t;
//! ```

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::error::Result;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature,
};

use crate::engine::call::{Marker, MarkerCall, MarkerKind};
use crate::error::{fail, ErrorKind};
use crate::plan::expand::expand_call;
use crate::tensor::Shape;

impl ScalarUDFImpl for Marker {
    fn name(&self) -> &str {
        self.kind().name()
    }

    fn signature(&self) -> &Signature {
        Marker::signature(self)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        unreachable!("return_field_from_args is implemented")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let positions = self.kind().wrt_positions(args.arg_fields.len())?;
        // A derivative is Float64, or a Float64 tensor of the variable's
        // shape (of f's for jvp).
        let float =
            |f: &FieldRef| Shape::of(f.data_type()).map_or(DataType::Float64, Shape::data_type);
        let data_type = if self.kind() == MarkerKind::Jvp {
            float(&args.arg_fields[0])
        } else if positions.len() == 1 {
            float(&args.arg_fields[positions[0]])
        } else {
            let names = self.kind().struct_names(
                positions
                    .iter()
                    .map(|&p| args.arg_fields[p].name().as_str()),
            )?;
            DataType::Struct(Fields::from(
                names
                    .into_iter()
                    .zip(&positions)
                    .map(|(n, &p)| Field::new(n, float(&args.arg_fields[p]), true))
                    .collect::<Vec<_>>(),
            ))
        };
        Ok(Arc::new(Field::new(self.name(), data_type, true)))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        fail(
            ErrorKind::MarkerReachedExecution,
            format!(
                "{}() reached execution without being rewritten into its derivative. It is \
                 rewritten by the optimizer's expression simplifier, or by the datafusion-grad \
                 analyzer rule when the optimizer is off; install both with \
                 datafusion_grad::register(&ctx) (a {} loaded over FFI cannot rewrite itself: \
                 use datafusion_grad's own context, or in the Python datafusion package \
                 ctx = datafusion_grad.install(ctx), or SELECT * FROM grad_query('<SQL>'))",
                self.name(),
                self.name()
            ),
        )
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        let call = MarkerCall {
            marker: self,
            args: &args,
        };
        Ok(ExprSimplifyResult::Simplified(expand_call(
            call,
            info.schema(),
        )?))
    }
}
