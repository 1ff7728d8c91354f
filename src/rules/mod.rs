//! The derivative rule table.
//!
//! A rule is data: for one primitive (a scalar function, an operator, `CASE`,
//! `CAST`) it gives the local partial derivatives `∂out/∂argᵢ` as DataFusion
//! [`Expr`]s over *symbolic* arguments (see [`Call`]). The engine
//! ([`crate::engine`]) uses the same partials for reverse mode (adjoint
//! accumulation, `grad`/`vjp`) and forward mode (tangent propagation, `jvp`),
//! like JAX's per-primitive jvp/transpose registry restricted to scalars.
//!
//! To find the rule for `atan2`, look in [`elementary`]; for `*` or `power`,
//! in [`arithmetic`]; for `CASE`, `greatest`, `abs`, `CAST`, in [`piecewise`];
//! for `matmul`, `softmax`, `cross_entropy` and the other tensor functions,
//! in [`tensor`]. Aggregates have two tables: [`aggregate`] (forward,
//! through an aggregate grouped by the variable) and [`transpose`]
//! (reverse, from a group's adjoint to its rows, for relational reverse
//! mode).
//!
//! A scalar primitive's partial is a number ([`Partial::Value`]) that flows
//! are multiplied by. A tensor primitive's partial is a linear map given in
//! both directions ([`Partial::Linear`]): its transpose applied to the
//! output's cotangent (reverse mode) and the map applied to the argument's
//! tangent (forward mode), each an expression over [`Call::flow`].
//!
//! Users add rules for their own scalar UDFs with [`Rules::insert`] or
//! [`crate::register_rule`] (the equivalent of JAX's `custom_jvp`):
//!
//! ```
//! use datafusion::prelude::*;
//! use datafusion_grad::rules::{Call, Partial, Rules};
//!
//! let mut rules = Rules::builtin();
//! // d/du softplus(u) = 1 / (1 + exp(-u))
//! rules.insert("softplus", |c: &Call| {
//!     Ok(vec![Partial::Value(lit(1.0) / (lit(1.0) + exp(-c.arg(0))))])
//! });
//! assert!(rules.get("softplus").is_some());
//! ```

pub mod aggregate;
pub mod arithmetic;
pub mod elementary;
pub mod piecewise;
pub mod tensor;
pub mod transpose;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::Expr;

use crate::reserved::Placeholder;
use crate::tensor::Shape;

/// One application of a primitive, as a rule sees it.
///
/// The arguments are symbolic: a literal argument is passed as its Float64
/// literal, any other as a placeholder column that the engine substitutes with
/// the argument's (shared) subexpression. [`Call::out`] is the application of
/// the primitive to those symbolic arguments, so using it in a partial refers to
/// the already computed output (e.g. `exp`'s derivative is `out`).
#[derive(Debug, Clone)]
pub struct Call {
    args: Vec<Expr>,
    out: Expr,
    shapes: Vec<Shape>,
    out_shape: Shape,
}

/// The local partial derivative of a primitive's output with respect to one argument.
#[derive(Debug, Clone)]
pub enum Partial {
    /// The derivative is zero everywhere (the argument is not differentiated).
    Zero,
    /// The derivative is this expression.
    Value(Expr),
    /// The derivative is this expression where the argument is the one
    /// selected (e.g. the `CASE` branch taken), and SQL NULL where it is not:
    /// the engine then treats the whole path as absent, so a NaN or NULL in an
    /// unselected branch never leaks into the derivative.
    Selected(Expr),
    /// The derivative is a linear map (a tensor primitive's Jacobian), given
    /// as `vjp`: the argument's cotangent for the output's cotangent
    /// [`Call::flow`], and `jvp`: the output's tangent for the argument's
    /// tangent [`Call::flow`].
    Linear {
        /// Reverse mode: the cotangent contribution to the argument.
        vjp: Expr,
        /// Forward mode: the tangent contribution to the output.
        jvp: Expr,
    },
}

/// A derivative rule for one primitive.
pub trait DerivativeRule: Send + Sync {
    /// The partial derivatives of `call`'s output, one per argument.
    fn partials(&self, call: &Call) -> Result<Vec<Partial>>;
}

impl<F> DerivativeRule for F
where
    F: Fn(&Call) -> Result<Vec<Partial>> + Send + Sync,
{
    fn partials(&self, call: &Call) -> Result<Vec<Partial>> {
        self(call)
    }
}

impl Call {
    /// A call of `out` whose symbolic arguments are `args`, of `shapes`.
    pub(crate) fn new(args: Vec<Expr>, out: Expr, shapes: Vec<Shape>, out_shape: Shape) -> Self {
        Self {
            args,
            out,
            shapes,
            out_shape,
        }
    }

    /// The placeholder expression for argument `i`.
    pub(crate) fn placeholder(i: usize) -> Expr {
        Placeholder::Arg.column(i)
    }

    /// Symbolic argument `i`.
    pub fn arg(&self, i: usize) -> Expr {
        self.args[i].clone()
    }

    /// Number of arguments.
    pub fn arity(&self) -> usize {
        self.args.len()
    }

    /// The value of argument `i` when it is a numeric literal.
    pub fn literal(&self, i: usize) -> Option<f64> {
        match &self.args[i] {
            Expr::Literal(ScalarValue::Float64(Some(v)), _) => Some(*v),
            _ => None,
        }
    }

    /// The primitive applied to the symbolic arguments (its output).
    pub fn out(&self) -> Expr {
        self.out.clone()
    }

    /// The flow a [`Partial::Linear`] map is applied to: the output's
    /// cotangent in its `vjp`, the argument's tangent in its `jvp`.
    pub fn flow(&self) -> Expr {
        Self::placeholder(self.args.len())
    }

    /// The shape of argument `i`.
    pub fn shape(&self, i: usize) -> Shape {
        self.shapes[i]
    }

    /// The shape of the output.
    pub fn out_shape(&self) -> Shape {
        self.out_shape
    }
}

/// The table of derivative rules, keyed by function name or operator symbol
/// (`"+"`, `"-"`, `"*"`, `"/"`, `"%"`, `"negate"`, `"cast"`, `"case"`).
#[derive(Clone, Default)]
pub struct Rules {
    table: BTreeMap<String, Arc<dyn DerivativeRule>>,
}

impl Rules {
    /// An empty table.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every built-in rule.
    pub fn builtin() -> Self {
        let mut rules = Self::empty();
        for (name, rule) in arithmetic::RULES
            .iter()
            .chain(elementary::RULES)
            .chain(piecewise::RULES)
            .chain(tensor::RULES)
        {
            rules.insert(name, *rule);
        }
        rules
    }

    /// Adds (or replaces) the rule for the function or operator `name`.
    pub fn insert(&mut self, name: &str, rule: impl DerivativeRule + 'static) {
        self.table.insert(name.to_ascii_lowercase(), Arc::new(rule));
    }

    /// The rule for `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn DerivativeRule>> {
        self.table.get(&name.to_ascii_lowercase())
    }

    /// The names with a rule, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.table.keys().map(String::as_str)
    }
}

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// A built-in rule: a name and the function computing the partials.
pub type RuleEntry = (&'static str, fn(&Call) -> Result<Vec<Partial>>);

/// A Float64 literal.
pub(crate) fn num(v: f64) -> Expr {
    Expr::Literal(ScalarValue::Float64(Some(v)), None)
}

/// A Float64 SQL NULL.
pub(crate) fn null() -> Expr {
    Expr::Literal(ScalarValue::Float64(None), None)
}
