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
//! PREPARE q(DOUBLE) AS SELECT grad(avg((x * $1 - y) ^ 2), $1) FROM t;
//! ```

use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};

use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema};
use datafusion::error::Result;
use datafusion::functions::core::expr_fn::named_struct;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    lit, ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature,
    Volatility,
};

use crate::engine::{differentiate_with_hints, Seed};
use crate::error::{fail, ErrorKind};
use crate::outer::localize;
use crate::rules::Rules;
use crate::tensor::Shape;

/// The rule table shared by the markers and the analyzer rule of one context.
pub type SharedRules = Arc<RwLock<Rules>>;

/// Which derivative a marker asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkerKind {
    /// `grad(f, x1 [, x2 …])`: reverse mode, all partials in one sweep.
    Grad,
    /// `jvp(f, x1, t1 [, x2, t2 …])`: forward mode, `Σ ∂f/∂xᵢ · tᵢ`.
    Jvp,
    /// `vjp(f, x1, u [, x2 …])`: reverse mode with cotangent `u`: `u · ∂f/∂xᵢ`.
    Vjp,
}

impl MarkerKind {
    /// The SQL function name.
    pub fn name(self) -> &'static str {
        match self {
            MarkerKind::Grad => "grad",
            MarkerKind::Jvp => "jvp",
            MarkerKind::Vjp => "vjp",
        }
    }

    fn usage(self) -> &'static str {
        match self {
            MarkerKind::Grad => "grad(f, x1 [, x2 …])",
            MarkerKind::Jvp => "jvp(f, x1, t1 [, x2, t2 …])",
            MarkerKind::Vjp => "vjp(f, x1, u [, x2 …])",
        }
    }

    /// Positions of the variables among the arguments, checking the arity.
    pub(crate) fn wrt_positions(self, n: usize) -> Result<Vec<usize>> {
        let ok = match self {
            MarkerKind::Grad => n >= 2,
            MarkerKind::Jvp => n >= 3 && n % 2 == 1,
            MarkerKind::Vjp => n >= 3,
        };
        if !ok {
            return fail(
                ErrorKind::WrongArity,
                format!("{} takes {}, got {n} arguments", self.name(), self.usage()),
            );
        }
        Ok(match self {
            MarkerKind::Grad => (1..n).collect(),
            MarkerKind::Jvp => (1..n).step_by(2).collect(),
            MarkerKind::Vjp => std::iter::once(1).chain(3..n).collect(),
        })
    }
}

/// A `grad`/`jvp`/`vjp` scalar UDF.
#[derive(Debug)]
pub struct Marker {
    kind: MarkerKind,
    signature: Signature,
    rules: SharedRules,
    nulls_like: Vec<(usize, usize)>,
}

impl PartialEq for Marker {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && Arc::ptr_eq(&self.rules, &other.rules)
            && self.nulls_like == other.nulls_like
    }
}

impl Eq for Marker {}

impl Hash for Marker {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
    }
}

impl Marker {
    /// A marker of `kind` differentiating with `rules`.
    pub fn new(kind: MarkerKind, rules: SharedRules) -> Self {
        Self {
            kind,
            signature: Signature::variadic_any(Volatility::Immutable),
            rules,
            nulls_like: Vec::new(),
        }
    }

    /// A `jvp` marker whose call has, for each pair `(t, v)`, a tangent at
    /// argument `t` that is SQL NULL exactly where argument `v` is (as the
    /// rewrite through aggregates knows of `avg(∂f/∂w)` and `avg(f)`), so the
    /// derivative tests `v` for NULL only where it must.
    pub(crate) fn jvp_with_nulls_like(rules: SharedRules, pairs: Vec<(usize, usize)>) -> Self {
        Self {
            nulls_like: pairs,
            ..Self::new(MarkerKind::Jvp, rules)
        }
    }

    /// The pairs given to [`Marker::jvp_with_nulls_like`].
    pub(crate) fn nulls_like(&self) -> &[(usize, usize)] {
        &self.nulls_like
    }

    /// Which derivative this marker asks for.
    pub fn kind(&self) -> MarkerKind {
        self.kind
    }

    /// The rule table this marker uses.
    pub fn rules(&self) -> &SharedRules {
        &self.rules
    }

    /// The derivative this call stands for, over `schema`, as self-contained
    /// expressions (see [`crate::engine::differentiate`]). A variable that
    /// is an outer reference (a marker inside a subquery) or a prepared
    /// statement's parameter is localized first (see `src/outer.rs`).
    pub fn rewrite(&self, args: &[Expr], schema: &DFSchema) -> Result<Expr> {
        if let Some(local) = localize(self.kind, args, schema)? {
            return local.restore(self.rewrite(&local.args, &local.schema)?);
        }
        let (wrt, seed) = self.kind.request(args)?;
        let rules = self.rules.read().expect("rule table lock");
        let hints = self
            .nulls_like
            .iter()
            .filter_map(|&(t, v)| Some((args.get(t)?.clone(), args.get(v)?.clone())))
            .collect();
        let mut exprs =
            differentiate_with_hints(&args[0], &wrt, seed, schema, &rules, hints)?.exprs;
        if exprs.len() == 1 {
            return Ok(exprs.remove(0));
        }
        let fields = self
            .kind
            .struct_names(wrt.iter().map(|c| c.name.as_str()))?;
        Ok(named_struct(
            fields
                .into_iter()
                .zip(exprs)
                .flat_map(|(name, e)| [lit(name), e])
                .collect(),
        ))
    }
}

impl MarkerKind {
    /// The variables and the seed of a call with `args`, checked.
    pub(crate) fn request(self, args: &[Expr]) -> Result<(Vec<Column>, Seed)> {
        let positions = self.wrt_positions(args.len())?;
        let mut wrt: Vec<Column> = Vec::with_capacity(positions.len());
        for &p in &positions {
            match &args[p] {
                Expr::Column(c) if !wrt.contains(c) => wrt.push(c.clone()),
                Expr::Column(c) => {
                    return fail(
                        ErrorKind::InvalidWrt,
                        format!("{}: the variable `{c}` is given twice", self.name()),
                    )
                }
                other => {
                    // A parameter bound before the plan is analyzed (the
                    // DataFrame API's parameter values) arrives as its value.
                    let hint = match other {
                        Expr::Literal(..) => {
                            "; a parameter bound before the derivative is taken arrives as its \
                             value: differentiate with respect to it in a prepared statement \
                             (`PREPARE q(DOUBLE) AS SELECT grad(f, $1) …; EXECUTE q(2.0)`), or \
                             make it a column, e.g. `SELECT avg(grad(f, w)) FROM t CROSS JOIN \
                             (SELECT $1 AS w) AS p`"
                        }
                        _ => "",
                    };
                    return fail(
                        ErrorKind::InvalidWrt,
                        format!(
                            "{}: argument {} must be a column of the input to differentiate \
                             with respect to, got `{other}`{hint}",
                            self.name(),
                            p + 1
                        ),
                    );
                }
            }
        }
        let seed = match self {
            MarkerKind::Grad => Seed::Grad,
            MarkerKind::Jvp => Seed::Jvp(positions.iter().map(|&p| args[p + 1].clone()).collect()),
            MarkerKind::Vjp => Seed::Vjp(args[2].clone()),
        };
        Ok((wrt, seed))
    }

    /// The struct field names for several variables: their column names, unique.
    pub(crate) fn struct_names<'a>(
        self,
        names: impl Iterator<Item = &'a str>,
    ) -> Result<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for name in names {
            if out.iter().any(|n| n == name) {
                return fail(
                    ErrorKind::InvalidWrt,
                    format!(
                        "{}: two variables are named `{name}`; the result struct needs distinct \
                         names, so differentiate with respect to them in separate calls",
                        self.name()
                    ),
                );
            }
            out.push(name.to_string());
        }
        Ok(out)
    }
}

impl ScalarUDFImpl for Marker {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        unreachable!("return_field_from_args is implemented")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let positions = self.kind.wrt_positions(args.arg_fields.len())?;
        // A derivative is Float64, or a Float64 tensor of the variable's
        // shape (of f's for jvp).
        let float =
            |f: &FieldRef| Shape::of(f.data_type()).map_or(DataType::Float64, Shape::data_type);
        let data_type = if self.kind == MarkerKind::Jvp {
            float(&args.arg_fields[0])
        } else if positions.len() == 1 {
            float(&args.arg_fields[positions[0]])
        } else {
            let names = self.kind.struct_names(
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
        Ok(ExprSimplifyResult::Simplified(
            self.rewrite(&args, info.schema())?,
        ))
    }
}

/// The marker behind `expr`, if `expr` is a call of one.
pub fn as_marker(expr: &Expr) -> Option<&Marker> {
    match expr {
        Expr::ScalarFunction(f) => f.func.inner().downcast_ref::<Marker>(),
        _ => None,
    }
}

/// Rewrites every marker call in `expr` (innermost first) into its derivative.
pub fn expand_markers(expr: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    expr.transform_up(|e| match as_marker(&e) {
        Some(marker) => {
            let Expr::ScalarFunction(call) = &e else {
                unreachable!("as_marker matched a scalar function")
            };
            Ok(Transformed::yes(marker.rewrite(&call.args, schema)?))
        }
        None => Ok(Transformed::no(e)),
    })
}
