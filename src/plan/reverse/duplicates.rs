//! The check that a parameter relation's rows are told apart by their
//! identity columns: a gradient table row that stands for several
//! parameter rows fails when it is computed.

use datafusion::arrow::array::{new_null_array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use crate::error::{fail, ErrorKind};
use crate::reserved::DUPLICATE_ROWS;

/// `__dfgrad_duplicate_rows(n)`: fails with a typed `invalid_wrt` error
/// where some `n` (the parameter rows a gradient table row stands for) is
/// above 1; NULL elsewhere.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct DuplicateRows {
    relation: String,
    identity: Vec<String>,
    signature: Signature,
}

impl DuplicateRows {
    /// The check for the parameter relation named `relation` (in messages),
    /// whose rows the columns `identity` tell apart.
    pub fn new(relation: &str, identity: &[String]) -> Self {
        Self {
            relation: relation.to_string(),
            identity: identity.to_vec(),
            signature: Signature::any(1, Volatility::Volatile),
        }
    }
}

impl ScalarUDFImpl for DuplicateRows {
    fn name(&self) -> &str {
        DUPLICATE_ROWS
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.args[0].to_array(args.number_rows)?;
        let n = cast(&n, &DataType::Int64)?;
        if !n
            .as_primitive::<Int64Type>()
            .iter()
            .any(|n| n.unwrap_or(0) > 1)
        {
            return Ok(ColumnarValue::Array(new_null_array(
                &DataType::Float64,
                args.number_rows,
            )));
        }
        let identity = match self.identity.is_empty() {
            true => "it has no other column".to_string(),
            false => format!("(`{}`)", self.identity.join("`, `")),
        };
        fail(
            ErrorKind::InvalidWrt,
            format!(
                "the variable's relation `{}` has several rows with the same other columns \
                 {identity}, so a derivative with respect to one row's value cannot be told \
                 from another's; give the relation a column that identifies its rows (a key)",
                self.relation
            ),
        )
    }
}
