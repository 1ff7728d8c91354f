//! The differentiation engine, shared by the markers' `simplify`, the analyzer
//! rule and the text export.
//!
//! `f` is interned into a hash-consed DAG ([`graph`]); nodes that depend on a
//! variable are *active*. Reverse mode (`grad`, `vjp`) walks the active nodes
//! in reverse topological order, summing adjoint contributions
//! `adjoint(out) · ∂out/∂arg` from the rule table ([`crate::rules`]); forward
//! mode (`jvp`) walks them in order, summing `∂out/∂arg · tangent(arg)`. Each
//! partial is interned into the same DAG, so shared subexpressions stay shared
//! and the derivative of an `n`-node expression is `O(n)` nodes.
//!
//! Semantics fixed here:
//! - Integer and decimal variables are promoted to Float64 (`f` is treated as
//!   a real function: over an integer `x`, `x / 2` has derivative 0.5).
//! - A derivative is SQL NULL exactly when `f` (or a tangent/cotangent) is NULL.
//! - A path through an unselected branch (`CASE`, `coalesce`, `greatest`, …)
//!   contributes nothing, even where that branch is NaN or NULL.

pub mod graph;
pub mod primitive;

use std::collections::HashMap;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::functions::core::coalesce;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{when, Cast, Expr, ExprSchemable, Operator};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;

use crate::error::{fail, ErrorKind, GradError};
use crate::rules::{Call, Partial, Rules, ARG_PREFIX};
use graph::{Graph, NodeId};

/// What to differentiate and how to seed it.
#[derive(Debug, Clone)]
pub enum Seed {
    /// Reverse mode with cotangent 1: one derivative per variable.
    Grad,
    /// Forward mode with one tangent per variable: one directional derivative.
    Jvp(Vec<Expr>),
    /// Reverse mode with this cotangent: one derivative per variable.
    Vjp(Expr),
}

/// A derivative and its size.
#[derive(Debug, Clone)]
pub struct Derivative {
    /// The derivative expressions: one per variable (`grad`, `vjp`) or one (`jvp`).
    pub exprs: Vec<Expr>,
    /// Distinct nodes of `f`.
    pub forward_nodes: usize,
    /// Distinct nodes of all derivative expressions together, as a DAG.
    pub derivative_nodes: usize,
}

/// Differentiates `f` with respect to the columns `wrt`, as seeded by `seed`.
///
/// `schema` is the schema `f` is evaluated against; the result expressions are
/// Float64 and need no further type coercion.
pub fn differentiate(
    f: &Expr,
    wrt: &[Column],
    seed: Seed,
    schema: &DFSchema,
    rules: &Rules,
) -> Result<Derivative> {
    let promoted = promote_variables(f.clone(), wrt, schema)?;
    let mut sweep = Sweep::new(promoted, wrt, schema, rules)?;
    let (outputs, extra_nulls) = match seed {
        Seed::Grad => {
            let one = sweep.g.num(1.0);
            (sweep.reverse((one, None))?, vec![])
        }
        Seed::Vjp(u) => {
            let u_id = sweep.value_of(u.clone())?;
            (sweep.reverse((u_id, None))?, vec![u])
        }
        Seed::Jvp(tangents) => {
            let ids = tangents
                .iter()
                .map(|t| sweep.value_of(t.clone()))
                .collect::<Result<Vec<_>>>()?;
            (vec![sweep.forward(&ids)?], tangents)
        }
    };
    let roots: Vec<NodeId> = outputs
        .into_iter()
        .map(|(id, guard)| match guard {
            Some(_) => sweep.coalesce_zero(id),
            None => id,
        })
        .collect();
    let derivative_nodes = sweep.g.size(&roots);
    let exprs = sweep.g.emit(&roots);

    let mut null_if = Vec::new();
    for e in std::iter::once(f).chain(&extra_nulls) {
        if e.nullable(schema)? {
            null_if.push(e.clone().is_null());
        }
    }
    let exprs = match null_if.into_iter().reduce(Expr::or) {
        None => exprs,
        Some(cond) => exprs
            .into_iter()
            .map(|d| when(cond.clone(), crate::rules::null()).otherwise(d))
            .collect::<Result<_>>()?,
    };
    Ok(Derivative {
        exprs,
        forward_nodes: sweep.forward_nodes,
        derivative_nodes,
    })
}

/// Replaces each non-Float64 variable by `CAST(x AS DOUBLE)` and re-coerces `f`.
/// Widening casts of integers (which type coercion inserts, e.g. `CAST(n AS
/// BIGINT) * 3`) are removed first: they are the identity on integers, not a
/// step function, and re-coercion redoes what they did in Float64.
fn promote_variables(f: Expr, wrt: &[Column], schema: &DFSchema) -> Result<Expr> {
    let t = f.get_type(schema)?;
    if !(t.is_numeric() || t == DataType::Null) {
        return fail(
            ErrorKind::UnsupportedType,
            format!("cannot differentiate `{f}`: its type is {t}, not a number"),
        );
    }
    let mut promote = Vec::new();
    for c in wrt {
        let t = schema.qualified_field_from_column(c)?.1.data_type();
        match t {
            DataType::Float64 => {}
            t if t.is_numeric() => promote.push(c.clone()),
            t => {
                return fail(
                    ErrorKind::UnsupportedType,
                    format!("cannot differentiate with respect to `{c}` of type {t}"),
                )
            }
        }
    }
    if promote.is_empty() {
        return Ok(f);
    }
    let f = f
        .transform_up(|e| match e {
            Expr::Cast(c) if is_widening(&c.expr, c.field.data_type(), schema) => {
                Ok(Transformed::yes(*c.expr))
            }
            Expr::TryCast(c) if is_widening(&c.expr, c.field.data_type(), schema) => {
                Ok(Transformed::yes(*c.expr))
            }
            e => Ok(Transformed::no(e)),
        })?
        .data
        .transform_up(|e| match &e {
            Expr::Column(c) if promote.contains(c) => Ok(Transformed::yes(to_float(e))),
            _ => Ok(Transformed::no(e)),
        })?
        .data;
    ExprSimplifier::new(SimplifyContext::default()).coerce(f, schema)
}

/// Whether casting `e` to `target` keeps every value: an integer to a wider
/// integer or to a decimal.
fn is_widening(e: &Expr, target: &DataType, schema: &DFSchema) -> bool {
    let Ok(source) = e.get_type(schema) else {
        return false;
    };
    source.is_integer()
        && (target.is_integer() && target.primitive_width() >= source.primitive_width()
            || matches!(target, DataType::Decimal128(..) | DataType::Decimal256(..)))
}

fn to_float(e: Expr) -> Expr {
    Expr::Cast(Cast::new(Box::new(e), DataType::Float64))
}

/// The state of one differentiation.
struct Sweep<'a> {
    g: Graph,
    root: NodeId,
    wrt: Vec<NodeId>,
    active: Vec<bool>,
    forward_nodes: usize,
    schema: &'a DFSchema,
    rules: &'a Rules,
    types: HashMap<NodeId, DataType>,
    safe: HashMap<NodeId, bool>,
}

/// An adjoint or tangent: a node, and the guard of its path — a boolean node
/// that is true on the rows where every selection along the path (`CASE`
/// branch, `greatest` argument, …) is taken; `None` when it is every row.
type Flow = (NodeId, Option<NodeId>);

/// A local partial derivative: a node, and whether it selects (is NULL on the
/// rows where its argument is not the one selected).
type Local = (NodeId, bool);

impl<'a> Sweep<'a> {
    fn new(f: Expr, wrt: &[Column], schema: &'a DFSchema, rules: &'a Rules) -> Result<Self> {
        let mut g = Graph::new();
        let root = g.intern(f, false, &mut |_| Ok(None))?;
        let forward_nodes = g.size(&[root]);
        let mut wrt_ids = Vec::with_capacity(wrt.len());
        for c in wrt {
            let t = schema.qualified_field_from_column(c)?.1.data_type().clone();
            let mut v = Expr::Column(c.clone());
            if t != DataType::Float64 {
                v = to_float(v);
            }
            wrt_ids.push(g.intern(v, false, &mut |_| Ok(None))?);
        }
        let mut active = vec![false; g.len()];
        for id in 0..g.len() {
            let shell = g.shell(id);
            primitive::check_volatility(shell)?;
            active[id] = wrt_ids.contains(&id)
                || (!primitive::blocks(shell)
                    && g.args(id)
                        .iter()
                        .enumerate()
                        .any(|(i, &a)| active[a] && primitive::differentiated(shell, i)));
        }
        Ok(Self {
            g,
            root,
            wrt: wrt_ids,
            active,
            forward_nodes,
            schema,
            rules,
            types: HashMap::new(),
            safe: HashMap::new(),
        })
    }

    fn is_active(&self, id: NodeId) -> bool {
        self.active.get(id).copied().unwrap_or(false)
    }

    /// Reverse accumulation from the root seeded with `seed`; one flow per variable.
    fn reverse(&mut self, seed: Flow) -> Result<Vec<Flow>> {
        let zero = self.g.num(0.0);
        let mut results = vec![(zero, None); self.wrt.len()];
        if !self.is_active(self.root) {
            return Ok(results);
        }
        let mut incoming: HashMap<NodeId, Vec<Flow>> = HashMap::new();
        incoming.insert(self.root, vec![seed]);
        for id in (0..=self.root).rev() {
            let Some(terms) = incoming.remove(&id) else {
                continue;
            };
            let adjoint = self.sum(terms);
            if let Some(k) = self.wrt.iter().position(|&w| w == id) {
                results[k] = adjoint;
                continue;
            }
            let args = self.g.args(id).to_vec();
            for (arg, partial) in args.into_iter().zip(self.partials(id)?) {
                if let (true, Some(p)) = (self.is_active(arg), partial) {
                    let term = self.product(adjoint, p)?;
                    incoming.entry(arg).or_default().push(term);
                }
            }
        }
        Ok(results)
    }

    /// Forward accumulation with one tangent per variable; the root's tangent.
    fn forward(&mut self, tangents: &[NodeId]) -> Result<Flow> {
        let mut needed = vec![false; self.root + 1];
        needed[self.root] = self.is_active(self.root);
        for id in (0..=self.root).rev() {
            if !needed[id] || self.wrt.contains(&id) {
                continue;
            }
            let shell = self.g.shell(id).clone();
            for (i, &a) in self.g.args(id).iter().enumerate() {
                if self.is_active(a) && primitive::differentiated(&shell, i) {
                    needed[a] = true;
                }
            }
        }
        let mut tangent: HashMap<NodeId, Flow> = HashMap::new();
        let order: Vec<NodeId> = (0..=self.root).filter(|&id| needed[id]).collect();
        for id in order {
            if let Some(k) = self.wrt.iter().position(|&w| w == id) {
                tangent.insert(id, (tangents[k], None));
                continue;
            }
            let args = self.g.args(id).to_vec();
            let mut terms = Vec::new();
            for (arg, partial) in args.into_iter().zip(self.partials(id)?) {
                if let (Some(&t), Some(p)) = (tangent.get(&arg), partial) {
                    terms.push(self.product(t, p)?);
                }
            }
            let flow = if terms.is_empty() {
                (self.g.num(0.0), None)
            } else {
                self.sum(terms)
            };
            tangent.insert(id, flow);
        }
        Ok(tangent
            .get(&self.root)
            .copied()
            .unwrap_or_else(|| (self.g.num(0.0), None)))
    }

    /// The flow `flow · p` along one edge.
    ///
    /// A guarded flow is NULL off its guard, so `flow · p` is too. When `p`
    /// might raise an error where its branch is not taken (see
    /// [`Sweep::is_safe`]) the product becomes `CASE WHEN guard THEN flow · p
    /// END`, so `p` is only evaluated on the selected rows, as `f`'s own `CASE`
    /// does (`sqrt` of a negative number in an unselected branch never raises
    /// an error). When `p` selects (is NULL off its branch), the guard narrows
    /// to `CASE WHEN guard THEN p IS NOT NULL ELSE false END`. Guards are built
    /// from selection conditions only, never from flows, so no flow is
    /// duplicated in the emitted expression.
    fn product(&mut self, (flow, guard): Flow, (p, selects): Local) -> Result<Flow> {
        let mut term = self.g.binary(Operator::Multiply, flow, p);
        if let Some(g) = guard {
            if self.g.number(term) != Some(0.0) && !self.is_safe(p)? {
                term = self.case_when(g, term, None);
            }
        }
        if !selects {
            return Ok((term, guard));
        }
        let on_branch = self
            .g
            .add(Expr::IsNotNull(Box::new(graph::hole())), vec![p]);
        let guard = match guard {
            None => on_branch,
            Some(g) => {
                let no = self.g.add(
                    Expr::Literal(ScalarValue::Boolean(Some(false)), None),
                    vec![],
                );
                self.case_when(g, on_branch, Some(no))
            }
        };
        Ok((term, Some(guard)))
    }

    /// Whether evaluating node `id` can never raise an error, whatever the
    /// row: float arithmetic, comparisons, `CASE`, and the math functions that
    /// return NaN or ±inf outside their domain. `sqrt` (an error for negative
    /// numbers), `power` (zero to a negative power), integer arithmetic
    /// (division by zero, overflow) and unknown functions are not.
    fn is_safe(&mut self, id: NodeId) -> Result<bool> {
        // The nodes below `id` not classified yet; ascending ids are a
        // topological order, so children are classified before parents.
        let mut todo = std::collections::BTreeSet::new();
        let mut stack = vec![id];
        while let Some(n) = stack.pop() {
            if !self.safe.contains_key(&n) && todo.insert(n) {
                stack.extend(self.g.args(n));
            }
        }
        for n in todo {
            let own = match self.g.shell(n) {
                Expr::Literal(..)
                | Expr::Column(_)
                | Expr::Negative(_)
                | Expr::IsNull(_)
                | Expr::IsNotNull(_)
                | Expr::Not(_)
                | Expr::Case(_) => true,
                Expr::BinaryExpr(b) if graph::is_arithmetic(b.op) => {
                    primitive::is_float(&self.data_type(n)?)
                }
                Expr::BinaryExpr(_) => true,
                Expr::Cast(_) | Expr::TryCast(_) => {
                    let arg = self.g.args(n)[0];
                    self.data_type(arg)?.is_numeric()
                }
                Expr::ScalarFunction(f) => primitive::SAFE_FUNCTIONS.contains(&f.func.name()),
                _ => false,
            };
            let safe = own && self.g.args(n).iter().all(|a| self.safe[a]);
            self.safe.insert(n, safe);
        }
        Ok(self.safe[&id])
    }

    /// `CASE WHEN cond THEN then [ELSE otherwise] END`.
    fn case_when(&mut self, cond: NodeId, then: NodeId, otherwise: Option<NodeId>) -> NodeId {
        let hole = || Box::new(graph::hole());
        let shell = Expr::Case(datafusion::logical_expr::Case::new(
            None,
            vec![(hole(), hole())],
            otherwise.map(|_| hole()),
        ));
        self.g
            .add(shell, [cond, then].into_iter().chain(otherwise).collect())
    }

    /// Sums flows; off its guard, a term counts as 0. When every term is
    /// guarded, the sum is guarded by the union of the guards (and NULL off it).
    fn sum(&mut self, terms: Vec<Flow>) -> Flow {
        if terms.len() == 1 {
            return terms[0];
        }
        let mut guards: Vec<NodeId> = Vec::new();
        let mut all_guarded = true;
        let mut ids = Vec::with_capacity(terms.len());
        for (t, guard) in terms {
            match guard {
                Some(g) => {
                    if !guards.contains(&g) {
                        guards.push(g);
                    }
                    ids.push(self.coalesce_zero(t));
                }
                None => {
                    all_guarded = false;
                    ids.push(t);
                }
            }
        }
        let total = ids
            .into_iter()
            .reduce(|a, b| self.g.binary(Operator::Plus, a, b))
            .expect("at least one term");
        if !all_guarded {
            return (total, None);
        }
        let guard = guards
            .into_iter()
            .reduce(|a, b| self.g.binary(Operator::Or, a, b))
            .expect("at least one guard");
        (self.case_when(guard, total, None), Some(guard))
    }

    /// `coalesce(t, 0.0)`.
    fn coalesce_zero(&mut self, t: NodeId) -> NodeId {
        let zero = self.g.num(0.0);
        let shell = Expr::ScalarFunction(ScalarFunction::new_udf(
            coalesce(),
            vec![graph::hole(), graph::hole()],
        ));
        self.g.add(shell, vec![t, zero])
    }

    /// The partial derivatives of node `id`, interned: `(node, selected)` per argument.
    fn partials(&mut self, id: NodeId) -> Result<Vec<Option<Local>>> {
        let shell = self.g.shell(id).clone();
        let key = primitive::rule_key(&shell)?;
        let rule = self
            .rules
            .get(&key)
            .or_else(|| match &shell {
                Expr::ScalarFunction(f) => f.func.aliases().iter().find_map(|a| self.rules.get(a)),
                _ => None,
            })
            .cloned()
            .ok_or_else(|| {
                GradError::non_differentiable(&key, "no derivative rule is registered for it")
            })?;
        let args = self.g.args(id).to_vec();
        let symbolic: Vec<Expr> = args
            .iter()
            .enumerate()
            .map(|(i, &a)| match self.literal_value(a) {
                Some(v) => crate::rules::num(v),
                None => Call::placeholder(i),
            })
            .collect();
        let call = Call::new(symbolic.clone(), graph::fill(shell, symbolic));
        let partials = rule.partials(&call)?;
        if partials.len() != args.len() {
            return fail(
                ErrorKind::NonDifferentiable,
                format!(
                    "the rule for `{key}` returned {} partials for {} arguments",
                    partials.len(),
                    args.len()
                ),
            );
        }
        // Numbers enter partials as Float64; other arguments (CASE conditions) as they are.
        let mut values: Vec<NodeId> = Vec::with_capacity(args.len());
        for &a in &args {
            let numeric = self
                .data_type(a)
                .is_ok_and(|t| t.is_numeric() || t == DataType::Null);
            values.push(if numeric { self.value(a)? } else { a });
        }
        let mut out = Vec::with_capacity(args.len());
        for partial in partials {
            let (expr, selected) = match partial {
                Partial::Zero => {
                    out.push(None);
                    continue;
                }
                Partial::Value(e) => (e, false),
                Partial::Selected(e) => (e, true),
            };
            let node = self.g.intern(expr, true, &mut |e| match e {
                Expr::Column(c) if c.relation.is_none() && c.name.starts_with(ARG_PREFIX) => {
                    let i: usize = c.name[ARG_PREFIX.len()..].parse().unwrap_or(usize::MAX);
                    match values.get(i) {
                        Some(v) => Ok(Some(*v)),
                        None => fail(
                            ErrorKind::NonDifferentiable,
                            format!("the rule for `{key}` refers to a missing argument {i}"),
                        ),
                    }
                }
                _ => Ok(None),
            })?;
            out.push(Some((node, selected)));
        }
        Ok(out)
    }

    /// A numeric literal node's value as f64.
    fn literal_value(&self, id: NodeId) -> Option<f64> {
        match self.g.shell(id) {
            Expr::Literal(v, _) if !v.is_null() && v.data_type().is_numeric() => {
                match v.cast_to(&DataType::Float64).ok()? {
                    ScalarValue::Float64(Some(x)) => Some(x),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Interns `e` (a seed) as a Float64 value.
    fn value_of(&mut self, e: Expr) -> Result<NodeId> {
        let id = self.g.intern(e, false, &mut |_| Ok(None))?;
        self.value(id)
    }

    /// Node `id` as a Float64 value: itself, or a cast of it.
    fn value(&mut self, id: NodeId) -> Result<NodeId> {
        if let Some(v) = self.literal_value(id) {
            return Ok(self.g.num(v));
        }
        let t = self.data_type(id)?;
        match t {
            DataType::Float64 => Ok(id),
            t if t.is_numeric() || t == DataType::Null => {
                let shell = to_float(Expr::Literal(ScalarValue::Null, None));
                Ok(self.g.add(shell, vec![id]))
            }
            t => fail(
                ErrorKind::UnsupportedType,
                format!("a value of type {t} cannot take part in a derivative"),
            ),
        }
    }

    /// The data type of node `id`. Active nodes are Float64 (variables are
    /// promoted) unless they are a cast to another float type.
    fn data_type(&mut self, id: NodeId) -> Result<DataType> {
        if self.is_active(id) {
            return Ok(match self.g.shell(id) {
                Expr::Cast(c) => c.field.data_type().clone(),
                Expr::TryCast(c) => c.field.data_type().clone(),
                _ => DataType::Float64,
            });
        }
        if let Some(t) = self.types.get(&id) {
            return Ok(t.clone());
        }
        let expr = self.g.emit(&[id]).pop().expect("one expression");
        let t = expr.get_type(self.schema)?;
        self.types.insert(id, t.clone());
        Ok(t)
    }
}
