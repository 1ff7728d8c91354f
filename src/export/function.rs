//! The SQL function `differentiate_sql(expr, wrt [, dialect])`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};

use super::{differentiate_sql, SqlDialect};

/// `differentiate_sql(expr, wrt [, dialect])`: the derivative of the SQL
/// expression text `expr` with respect to the column named `wrt`, as SQL
/// text of `dialect` (`datafusion` by default; also `duckdb`, `postgres`,
/// `sqlite`, `generic`). See [`differentiate_sql`] for the conventions.
///
/// ```sql
/// SELECT differentiate_sql('x * y + sin(x)', 'x', 'duckdb');
/// -- (cos(x) + y)
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DifferentiateSql {
    signature: Signature,
}

impl Default for DifferentiateSql {
    fn default() -> Self {
        Self {
            signature: Signature::one_of(
                vec![TypeSignature::String(2), TypeSignature::String(3)],
                Volatility::Immutable,
            ),
        }
    }
}

impl ScalarUDFImpl for DifferentiateSql {
    fn name(&self) -> &str {
        "differentiate_sql"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let all_scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let texts: Vec<ArrayRef> = arrays
            .iter()
            .map(|a| datafusion::arrow::compute::cast(a, &DataType::Utf8))
            .collect::<std::result::Result<_, _>>()?;
        let texts: Vec<_> = texts.iter().map(|a| a.as_string::<i32>()).collect();
        let mut out = StringBuilder::new();
        for row in 0..args.number_rows {
            if texts.iter().any(|t| t.is_null(row)) {
                out.append_null();
                continue;
            }
            let dialect = match texts.get(2) {
                Some(d) => d.value(row).parse::<SqlDialect>()?,
                None => SqlDialect::DataFusion,
            };
            out.append_value(differentiate_sql(
                texts[0].value(row),
                texts[1].value(row),
                dialect,
            )?);
        }
        let array: ArrayRef = Arc::new(out.finish());
        Ok(match all_scalar {
            true => ColumnarValue::Scalar(ScalarValue::try_from_array(&array, 0)?),
            false => ColumnarValue::Array(array),
        })
    }
}
