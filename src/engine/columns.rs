//! Constant-time lookup of a schema's columns.
//!
//! `DFSchema`'s own lookups scan every field (and collect the matches), which
//! makes differentiating with respect to thousands of columns quadratic.

use datafusion::arrow::datatypes::Field;
use datafusion::common::{Column, DFSchema, HashMap};
use datafusion::error::Result;

/// The fields of a schema, indexed by qualified and by bare name.
pub(crate) struct Columns<'a> {
    schema: &'a DFSchema,
    qualified: HashMap<(String, &'a str), usize>,
    /// The field with this name, whatever its qualifier; `None` when several
    /// fields have it.
    named: HashMap<&'a str, Option<usize>>,
}

impl<'a> Columns<'a> {
    /// An index of `schema`'s fields.
    pub(crate) fn new(schema: &'a DFSchema) -> Self {
        let mut qualified = HashMap::new();
        let mut named: HashMap<&str, Option<usize>> = HashMap::with_capacity(schema.fields().len());
        for (i, (q, f)) in schema.iter().enumerate() {
            if let Some(q) = q {
                qualified.insert((q.to_string(), f.name().as_str()), i);
            }
            named
                .entry(f.name().as_str())
                .and_modify(|unique| *unique = None)
                .or_insert(Some(i));
        }
        Self {
            schema,
            qualified,
            named,
        }
    }

    /// The field `c` refers to. Where the index has no unique answer (an
    /// ambiguous or missing name, a partial qualifier) DataFusion's own lookup
    /// decides, with its error.
    pub(crate) fn field(&self, c: &Column) -> Result<&'a Field> {
        let found = match &c.relation {
            Some(q) => self
                .qualified
                .get(&(q.to_string(), c.name.as_str()))
                .copied(),
            None => self.named.get(c.name.as_str()).copied().flatten(),
        };
        match found {
            Some(i) => Ok(self.schema.field(i)),
            None => Ok(self.schema.qualified_field_from_column(c)?.1),
        }
    }
}
