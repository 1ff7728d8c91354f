//! A workspace: one hash-consed DAG in which any number of derivatives over
//! one schema are built, so they share every common subexpression — with each
//! other (`grad(loss, w)` and `grad(loss, b)` in one `SELECT`), with `f`, and
//! across nesting (`grad(grad(f, x), x)` differentiates the inner derivative's
//! DAG, never its expanded tree).

use std::borrow::Cow;
use std::rc::Rc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, HashMap, HashSet, ScalarValue};
use datafusion::error::Result;
use datafusion::functions::core::named_struct;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{Case, Cast, Expr, ExprSchemable, Operator};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;

use super::call::{as_marker, into_marker, MarkerKind};
use super::columns::Columns;
use super::graph::{self, Graph, NodeId, NodeMap, ShellId};
use super::nulls::Nulls;
use super::primitive;
use super::sign::Sign;
use super::sweep::Sweep;
use super::template::{self, Partials};
use super::Seed;
use crate::error::{fail, ErrorKind, GradError};
use crate::reserved::Placeholder;
use crate::rules::Rules;
use crate::tensor::Shape;

/// A rule's partials compiled for one shell, with what else they depend on:
/// the literal arguments' values (as bits) and the argument and output shapes.
type Compiled = (Vec<Option<u64>>, (Vec<Shape>, Shape), Rc<Partials>);

/// Derivatives under construction over one schema.
pub struct Workspace<'a> {
    /// The DAG.
    // pub for the tests in tests/unit/engine_guard.rs
    #[doc(hidden)]
    pub g: Graph,
    schema: &'a DFSchema,
    pub(crate) columns: Columns<'a>,
    pub(crate) rules: &'a Rules,
    types: NodeMap<DataType>,
    nullable: NodeMap<bool>,
    pub(super) signs: NodeMap<Sign>,
    templates: HashMap<ShellId, Vec<Compiled>>,
    nulls_like: Vec<(Expr, Expr)>,
}

impl<'a> Workspace<'a> {
    /// An empty workspace for expressions over `schema`, differentiated with `rules`.
    pub fn new(schema: &'a DFSchema, rules: &'a Rules) -> Self {
        Self {
            g: Graph::new(),
            schema,
            columns: Columns::new(schema),
            rules,
            types: NodeMap::default(),
            nullable: NodeMap::default(),
            signs: NodeMap::default(),
            templates: HashMap::new(),
            nulls_like: Vec::new(),
        }
    }

    /// The DAG built so far.
    pub fn graph(&self) -> &Graph {
        &self.g
    }

    /// The schema the expressions are evaluated against.
    pub fn schema(&self) -> &DFSchema {
        self.schema
    }

    /// Adds `e` to the DAG. Marker calls inside `e` (`grad`, `jvp`, `vjp`) are
    /// differentiated here, into the same DAG.
    pub fn intern(&mut self, e: &Expr) -> Result<NodeId> {
        let mut inner: Vec<NodeId> = Vec::new();
        let rewritten = match e.exists(|e| Ok(as_marker(e).is_some()))? {
            true => Some(self.differentiate_markers(e.clone(), Placeholder::Node, &mut inner)?),
            false => None,
        };
        self.g
            .intern(rewritten.as_ref().unwrap_or(e), false, &mut |e| match e {
                Expr::Column(c) => Ok(Placeholder::Node
                    .index(c)
                    .and_then(|i| inner.get(i).copied())),
                _ => Ok(None),
            })
    }

    /// `e` with each outermost marker call differentiated into this workspace:
    /// its node is pushed to `nodes`, and the call replaced by the placeholder
    /// column `k` of the `placeholder` family, `k` its index there.
    pub(crate) fn differentiate_markers(
        &mut self,
        e: Expr,
        placeholder: Placeholder,
        nodes: &mut Vec<NodeId>,
    ) -> Result<Expr> {
        // A rewrite rebuilds every node; most expressions have no marker.
        if !e.exists(|e| Ok(as_marker(e).is_some()))? {
            return Ok(e);
        }
        Ok(e.transform_down(|e| {
            let Some(call) = as_marker(&e) else {
                return Ok(Transformed::no(e));
            };
            for &(seed, value) in call.marker.nulls_like() {
                if let (Some(s), Some(v)) = (call.args.get(seed), call.args.get(value)) {
                    self.nulls_like(s.clone(), v.clone());
                }
            }
            nodes.push(self.marker(call.kind(), call.args)?);
            Ok(Transformed::new(
                placeholder.column(nodes.len() - 1),
                true,
                TreeNodeRecursion::Jump,
            ))
        })?
        .data)
    }

    /// The derivative a marker call of `kind` with `args` stands for: one
    /// Float64 node, or a struct of them (one field per variable).
    pub fn marker(&mut self, kind: MarkerKind, args: &[Expr]) -> Result<NodeId> {
        let (wrt, seed) = kind.request(args)?;
        let outputs = self.derivative(&args[0], &wrt, seed)?;
        if outputs.len() == 1 {
            return Ok(outputs[0]);
        }
        let names = kind.struct_names(wrt.iter().map(|c| c.name.as_str()))?;
        let mut fields = Vec::with_capacity(2 * outputs.len());
        for (name, d) in names.into_iter().zip(outputs) {
            let name = self
                .g
                .add(Expr::Literal(ScalarValue::Utf8(Some(name)), None), &[]);
            fields.extend([name, d]);
        }
        let shell = Expr::ScalarFunction(ScalarFunction::new_udf(
            named_struct(),
            vec![graph::hole(); fields.len()],
        ));
        Ok(self.g.add(shell, &fields))
    }

    /// The derivatives of `f` with respect to `wrt` as seeded by `seed`: one
    /// node per variable (`grad`, `vjp`) or one node (`jvp`), Float64, NULL
    /// exactly where `f` (or a tangent/cotangent) is NULL.
    pub fn derivative(&mut self, f: &Expr, wrt: &[Column], seed: Seed) -> Result<Vec<NodeId>> {
        // Taken first: nested markers in `f` are differentiated below.
        let hints = std::mem::take(&mut self.nulls_like);
        self.refuse_integer_only_functions(f, wrt)?;
        refuse_bitwise(f, wrt)?;
        let promoted = promote_variables(f, wrt, &self.columns, self.schema)?;
        let root = self.intern(&promoted)?;
        // Typed node by node: DataFusion's own `get_type` on a deep `f` is
        // quadratic (each level formats its arguments' names).
        let t = self.data_type(root)?;
        let f_shape = match Shape::of(&t) {
            Some(s) if s.is_tensor() && matches!(seed, Seed::Grad) => {
                return fail(
                    ErrorKind::UnsupportedType,
                    format!(
                        "grad needs a number-valued f, but `{f}` is a {s}; use \
                         vjp(f, x, u) with a cotangent u of that shape, or jvp(f, x, t)"
                    ),
                )
            }
            Some(s) => s,
            None => {
                return fail(
                    ErrorKind::UnsupportedType,
                    format!("cannot differentiate `{f}`: its type is {t}, not a number or tensor"),
                )
            }
        };
        let f_nullable = self.nullable(root);
        let seeds = match &seed {
            Seed::Grad => vec![],
            Seed::Vjp(u) => vec![u.clone()],
            Seed::Jvp(tangents) => tangents.clone(),
        };
        let mut seed_ids = Vec::with_capacity(seeds.len());
        let mut nullable_seeds = Vec::new();
        for (k, s) in seeds.into_iter().enumerate() {
            // f's shape for a cotangent, the variable's for a tangent
            let want = match &seed {
                Seed::Jvp(_) => Shape::of(self.columns.field(&wrt[k])?.data_type()),
                _ => Some(f_shape),
            };
            let is_nullable = s.nullable(self.schema)?;
            let id = self.intern(&s)?;
            let id = self.value(id)?;
            let got = Shape::of(&self.data_type(id)?);
            if got != want {
                let role = match &seed {
                    Seed::Jvp(_) => "tangent",
                    _ => "cotangent",
                };
                return fail(
                    ErrorKind::ShapeMismatch,
                    format!(
                        "the {role} `{s}` is a {}, but must be a {}",
                        got.map_or("value".to_string(), |g| g.to_string()),
                        want.map_or("value".to_string(), |w| w.to_string())
                    ),
                );
            }
            if is_nullable {
                nullable_seeds.push(id);
            }
            seed_ids.push(id);
        }
        let mut like = Vec::with_capacity(hints.len());
        for (seed, value) in hints {
            let seed = self.intern(&seed)?;
            like.push((self.value(seed)?, self.intern(&value)?));
        }
        let mut sweep = Sweep::new(self, root, wrt)?;
        // The node whose shape each output has: its variable, or f for jvp.
        let likes = match seed {
            Seed::Jvp(_) => vec![root],
            _ => sweep.variables().to_vec(),
        };
        let outputs = match seed {
            Seed::Grad => {
                let one = sweep.ws.g.num(1.0);
                sweep.reverse((one, None))?
            }
            Seed::Vjp(_) => sweep.reverse((seed_ids[0], None))?,
            Seed::Jvp(_) => vec![sweep.forward(&seed_ids)?],
        };
        let outputs: Vec<NodeId> = outputs
            .into_iter()
            .zip(&likes)
            .map(|((id, guard), &like)| match guard {
                Some(guard) => self.zero_off(guard, id, like),
                None => Ok(id),
            })
            .collect::<Result<_>>()?;
        let f_nulls = f_nullable.then_some(root);
        let guards = Nulls::new(self, f_nulls, &nullable_seeds, &like, &outputs);
        let mut nulls = Vec::with_capacity(outputs.len());
        for &d in &outputs {
            let t = self.data_type(d)?;
            nulls.push(
                self.g
                    .add(Expr::Literal(ScalarValue::try_from(&t)?, None), &[]),
            );
        }
        Ok(outputs
            .into_iter()
            .zip(nulls)
            .map(|(d, null)| {
                let mut null_if = None;
                for id in guards.needed(d) {
                    let is_null = self.g.add(Expr::IsNull(Box::new(graph::hole())), &[id]);
                    null_if = Some(match null_if {
                        None => is_null,
                        Some(c) => self.g.binary(Operator::Or, c, is_null),
                    });
                }
                match null_if {
                    Some(cond) => self.case_when(cond, null, Some(d)),
                    None => d,
                }
            })
            .collect())
    }

    /// Declares, for the next [`Workspace::derivative`], that the tangent
    /// `seed` is SQL NULL exactly where `value` is (e.g. `avg(∂f/∂w)` and
    /// `avg(f)`), so a derivative that is NULL where `seed` is needs no test
    /// of `value`.
    pub(crate) fn nulls_like(&mut self, seed: Expr, value: Expr) {
        self.nulls_like.push((seed, value));
    }

    /// The partials of node `id`'s shell applied to arguments that are the
    /// literals `literals[i]` where given, compiled from the rule table once.
    pub(crate) fn templates(
        &mut self,
        id: NodeId,
        literals: &[Option<f64>],
        shapes: (Vec<Shape>, Shape),
    ) -> Result<Rc<Partials>> {
        let bits = || literals.iter().map(|v| v.map(f64::to_bits));
        let shell_id = self.g.shell_id(id);
        let known = self.templates.get(&shell_id).and_then(|compiled| {
            compiled
                .iter()
                .find(|(values, on, _)| values.iter().copied().eq(bits()) && *on == shapes)
        });
        if let Some((_, _, t)) = known {
            return Ok(Rc::clone(t));
        }
        let shell = self.g.shell(id);
        let name = primitive::rule_key(shell)?;
        let rule = self
            .rules
            .get(&name)
            .or_else(|| match shell {
                Expr::ScalarFunction(f) => f.func.aliases().iter().find_map(|a| self.rules.get(a)),
                _ => None,
            })
            .ok_or_else(|| {
                GradError::non_differentiable(&name, "no derivative rule is registered for it")
            })?;
        let compiled = Rc::new(template::compile(
            &name,
            shell,
            literals,
            shapes.clone(),
            |call| rule.partials(call),
        )?);
        self.templates.entry(shell_id).or_default().push((
            bits().collect(),
            shapes,
            Rc::clone(&compiled),
        ));
        Ok(compiled)
    }

    /// The data type of node `id`, typing each node once from its children's
    /// types (a child enters as a typed NULL, a literal child as itself).
    pub fn data_type(&mut self, id: NodeId) -> Result<DataType> {
        if let Some(t) = self.types.get(&id) {
            return Ok(t.clone());
        }
        let known = |ws: &Self, n| ws.types.contains_key(&n);
        self.classify(id, known, |ws, n| {
            let t = ws.type_of_node(n)?;
            ws.types.insert(n, t);
            Ok(())
        })?;
        Ok(self.types[&id].clone())
    }

    fn type_of_node(&self, n: NodeId) -> Result<DataType> {
        // The common cases directly, the rest by DataFusion's typing of the
        // node over typed NULL children.
        let float = |a: &NodeId| self.types[a] == DataType::Float64;
        match self.g.shell(n) {
            Expr::Column(c) => return Ok(self.columns.field(c)?.data_type().clone()),
            Expr::Literal(v, _) => return Ok(v.data_type()),
            Expr::Cast(c) => return Ok(c.field.data_type().clone()),
            Expr::IsNull(_) | Expr::IsNotNull(_) => return Ok(DataType::Boolean),
            Expr::Negative(_) if self.g.args(n).iter().all(float) => return Ok(DataType::Float64),
            Expr::BinaryExpr(b)
                if graph::is_arithmetic(b.op) && self.g.args(n).iter().all(float) =>
            {
                return Ok(DataType::Float64)
            }
            // A function of Float64 values: its return type for those types
            // (no argument is a literal whose value could decide the type).
            Expr::ScalarFunction(f) if self.g.args(n).iter().all(float) => {
                let types = vec![DataType::Float64; self.g.args(n).len()];
                if let Ok(t) = f.func.return_type(&types) {
                    return Ok(t);
                }
            }
            _ => {}
        }
        let mut children = Vec::with_capacity(self.g.args(n).len());
        for &a in self.g.args(n) {
            let child = match self.g.shell(a) {
                e @ Expr::Literal(..) => e.clone(),
                _ => match ScalarValue::try_from(&self.types[&a]) {
                    Ok(v) => Expr::Literal(v, None),
                    Err(_) => return self.g.emit(&[n])[0].get_type(self.schema),
                },
            };
            children.push(child);
        }
        graph::fill(self.g.shell(n).clone(), children)
            .get_type(self.schema)
            .or_else(|_| self.g.emit(&[n])[0].get_type(self.schema))
    }

    /// Runs `classify` on node `id` and on every node below it that is not
    /// `known` yet, each after its children (`classify` makes it known).
    pub(super) fn classify(
        &mut self,
        id: NodeId,
        known: impl Fn(&Self, NodeId) -> bool,
        mut classify: impl FnMut(&mut Self, NodeId) -> Result<()>,
    ) -> Result<()> {
        let mut stack = vec![id];
        while let Some(&n) = stack.last() {
            if known(self, n) {
                stack.pop();
                continue;
            }
            let before = stack.len();
            stack.extend(self.g.args(n).iter().filter(|&&a| !known(self, a)));
            if stack.len() == before {
                stack.pop();
                classify(self, n)?;
            }
        }
        Ok(())
    }

    /// Whether node `id` may be SQL NULL (conservative: true when unsure).
    /// Computed on the DAG: DataFusion's `Expr::nullable` formats argument
    /// names at every level, quadratic on deep expressions.
    pub fn nullable(&mut self, id: NodeId) -> bool {
        if let Some(&known) = self.nullable.get(&id) {
            return known;
        }
        let known = |ws: &Self, n| ws.nullable.contains_key(&n);
        self.classify(id, known, |ws, n| {
            let any_child = ws.g.args(n).iter().any(|a| ws.nullable[a]);
            let value = match ws.g.shell(n) {
                Expr::Column(c) => ws.columns.field(c).map_or(true, |f| f.is_nullable()),
                Expr::Literal(v, _) => v.is_null(),
                Expr::IsNull(_) | Expr::IsNotNull(_) => false,
                Expr::Case(case) => case.else_expr.is_none() || any_child,
                Expr::BinaryExpr(_) | Expr::Negative(_) | Expr::Cast(_) | Expr::Not(_) => any_child,
                Expr::ScalarFunction(f)
                    if f.func.name() != "nullif" && primitive::is_safe_function(f.func.name()) =>
                {
                    any_child
                }
                _ => true,
            };
            ws.nullable.insert(n, value);
            Ok(())
        })
        .expect("nullability is always known");
        self.nullable[&id]
    }

    /// Whether node `id`'s own operation can never raise an error, given
    /// values for its arguments: float arithmetic, comparisons, `CASE`, the
    /// math functions that return NaN or ±inf outside their domain, `sqrt`
    /// of a number known to be non-negative and `power` with a non-negative
    /// exponent or a positive base ([`Sign`]). Other `sqrt` calls (an error
    /// for negative numbers) and `power` calls (zero to a negative power),
    /// integer arithmetic (division by zero, overflow) and unknown functions
    /// are not.
    pub fn own_safe(&mut self, id: NodeId) -> Result<bool> {
        Ok(match self.g.shell(id) {
            Expr::Literal(..)
            | Expr::Column(_)
            | Expr::Negative(_)
            | Expr::IsNull(_)
            | Expr::IsNotNull(_)
            | Expr::Not(_)
            | Expr::Case(_) => true,
            Expr::BinaryExpr(b) if graph::is_arithmetic(b.op) => {
                primitive::is_float(&self.data_type(id)?)
            }
            Expr::BinaryExpr(_) => true,
            Expr::Cast(_) | Expr::TryCast(_) => {
                let arg = self.g.args(id)[0];
                self.data_type(arg)?.is_numeric()
            }
            Expr::ScalarFunction(f) if matches!(f.func.name(), "power" | "pow") => {
                let (base, exponent) = (self.g.args(id)[0], self.g.args(id)[1]);
                primitive::is_float(&self.data_type(id)?)
                    && (self.literal_value(exponent).is_some_and(|v| v >= 0.0)
                        || self.sign(exponent) >= Sign::NonNegative
                        || self.sign(base) == Sign::Positive)
            }
            Expr::ScalarFunction(f) if f.func.name() == "sqrt" => {
                let arg = self.g.args(id)[0];
                primitive::is_float(&self.data_type(id)?) && self.sign(arg) >= Sign::NonNegative
            }
            Expr::ScalarFunction(f) => primitive::is_safe_function(f.func.name()),
            _ => false,
        })
    }

    /// `CASE WHEN cond THEN then [ELSE otherwise] END`, without the `CASE`s
    /// at the top of `then` whose condition `cond` implies (see
    /// [`super::guard`]): `CASE WHEN g THEN (CASE WHEN g THEN e END) END` is
    /// `CASE WHEN g THEN e END`.
    // pub for the tests in tests/unit/engine_guard.rs
    #[doc(hidden)]
    pub fn case_when(&mut self, cond: NodeId, then: NodeId, otherwise: Option<NodeId>) -> NodeId {
        let then = self.under(cond, then);
        let hole = || Box::new(graph::hole());
        let shell = Expr::Case(Case::new(
            None,
            vec![(hole(), hole())],
            otherwise.map(|_| hole()),
        ));
        match otherwise {
            Some(otherwise) => self.g.add(shell, &[cond, then, otherwise]),
            None => self.g.add(shell, &[cond, then]),
        }
    }

    /// `CASE WHEN guard THEN t ELSE 0.0 END`: a guarded flow, 0 off its guard.
    /// (Not `coalesce(t, 0.0)`: DataFusion's simplifier expands `coalesce`
    /// into a `CASE` that repeats `t`, doubling nested flows at every level.)
    /// `like` gives the shape of the zero (a number, or a tensor of `like`'s shape).
    pub(crate) fn zero_off(&mut self, guard: NodeId, t: NodeId, like: NodeId) -> Result<NodeId> {
        let zero = self.zero_like(like)?;
        Ok(self.case_when(guard, t, Some(zero)))
    }

    /// A zero of node `like`'s shape: `0.0`, or `zeros_like(like)` for a tensor.
    pub(crate) fn zero_like(&mut self, like: NodeId) -> Result<NodeId> {
        if !Shape::is_tensor_type(&self.data_type(like)?) {
            return Ok(self.g.num(0.0));
        }
        let like = self.value(like)?;
        Ok(self.tensor_call("zeros_like", &[like]))
    }

    /// The elementwise sum of two tensor nodes.
    pub(crate) fn tensor_add(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.tensor_call("tensor_add", &[a, b])
    }

    /// The tensor node `t` times the number node `s`.
    pub(crate) fn scale(&mut self, t: NodeId, s: NodeId) -> NodeId {
        self.tensor_call("scale", &[t, s])
    }

    fn tensor_call(&mut self, name: &str, args: &[NodeId]) -> NodeId {
        let shell = crate::tensor::call(name, vec![graph::hole(); args.len()]);
        self.g.add(shell, args)
    }

    /// A numeric literal node's value as f64.
    /// A cast of a literal counts as the cast value (type coercion wraps
    /// literals in casts, e.g. the exponent of `power(x, 2)`).
    pub(crate) fn literal_value(&self, id: NodeId) -> Option<f64> {
        if let Some(x) = self.g.number(id) {
            return Some(x);
        }
        let v = self.literal(id)?;
        if v.is_null() || !v.data_type().is_numeric() {
            return None;
        }
        match v.cast_to(&DataType::Float64).ok()? {
            ScalarValue::Float64(Some(x)) => Some(x),
            _ => None,
        }
    }

    /// The value of node `id` when it is a literal or a cast of one.
    fn literal(&self, id: NodeId) -> Option<ScalarValue> {
        match self.g.shell(id) {
            Expr::Literal(v, _) => Some(v.clone()),
            Expr::Cast(c) => self
                .literal(self.g.args(id)[0])?
                .cast_to(c.field.data_type())
                .ok(),
            _ => None,
        }
    }

    /// Node `id` as a Float64 value (or Float64 tensor): itself, or a cast of it.
    pub(crate) fn value(&mut self, id: NodeId) -> Result<NodeId> {
        if let Some(v) = self.literal_value(id) {
            return Ok(self.g.num(v));
        }
        let t = self.data_type(id)?;
        match Shape::of(&t) {
            Some(shape) if shape.data_type() == t => Ok(id),
            Some(_) => {
                let shell = promoted(Expr::Literal(ScalarValue::Null, None), &t);
                Ok(self.g.add(shell, &[id]))
            }
            None => fail(
                ErrorKind::UnsupportedType,
                format!("a value of type {t} cannot take part in a derivative"),
            ),
        }
    }
}

impl Workspace<'_> {
    /// Refuses `f` when a function without a derivative rule reads a variable
    /// of an integer type: such a variable is promoted to Float64 below, and
    /// the function (e.g. `factorial`, `gcd`, defined on integers only) would
    /// otherwise fail as a type error instead of as not differentiable.
    fn refuse_integer_only_functions(&self, f: &Expr, wrt: &[Column]) -> Result<()> {
        let mut integer = Vec::new();
        for c in wrt {
            let t = self.columns.field(c)?.data_type();
            if Shape::of(t).is_some_and(|s| s.data_type() != *t) {
                integer.push(c);
            }
        }
        if integer.is_empty() {
            return Ok(());
        }
        f.apply(|e| {
            let Expr::ScalarFunction(call) = e else {
                return Ok(TreeNodeRecursion::Continue);
            };
            if as_marker(e).is_some() {
                return Ok(TreeNodeRecursion::Jump);
            }
            let func = &call.func;
            let ruled = std::iter::once(func.name())
                .chain(func.aliases().iter().map(String::as_str))
                .any(|name| self.rules.get(name).is_some());
            if !ruled && e.column_refs().iter().any(|c| integer.contains(c)) {
                return Err(GradError::non_differentiable(
                    func.name(),
                    "no derivative rule is registered for it",
                )
                .into());
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(())
    }
}

/// Refuses `f` when a bitwise operator reads a variable. DataFusion's `^` is
/// bitwise XOR, not a power: `(2 * x - 1) ^ 2` casts its operand to an
/// integer, so it would be differentiated as a step function (0) where the
/// writer almost surely meant `power(2 * x - 1, 2)`.
fn refuse_bitwise(f: &Expr, wrt: &[Column]) -> Result<()> {
    f.apply(|e| {
        if as_marker(e).is_some() {
            return Ok(TreeNodeRecursion::Jump);
        }
        let Expr::BinaryExpr(b) = e else {
            return Ok(TreeNodeRecursion::Continue);
        };
        let bitwise = matches!(
            b.op,
            Operator::BitwiseXor
                | Operator::BitwiseAnd
                | Operator::BitwiseOr
                | Operator::BitwiseShiftLeft
                | Operator::BitwiseShiftRight
        );
        if bitwise && e.column_refs().iter().any(|c| wrt.contains(c)) {
            let hint = match b.op {
                Operator::BitwiseXor => {
                    "it is a bitwise operator on integers, and `^` is bitwise XOR in                      DataFusion: for a power write power(a, b)"
                }
                _ => "it is a bitwise operator on integers",
            };
            return Err(GradError::non_differentiable(&b.op.to_string(), hint).into());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// Replaces each non-Float64 variable by `CAST(x AS DOUBLE)` and re-coerces `f`.
/// Widening casts of integers (which type coercion inserts, e.g. `CAST(n AS
/// BIGINT) * 3`) are removed first: they are the identity on integers, not a
/// step function, and re-coercion redoes what they did in Float64. Integer
/// `/` and `%` over a variable are then kept as the step functions the query
/// evaluates (`CAST(x / 2 AS BIGINT)`: truncated, derivative 0), not turned
/// into real division. The
/// variables of nested markers stay columns (each marker promotes its own).
fn promote_variables<'f>(
    f: &'f Expr,
    wrt: &[Column],
    columns: &Columns,
    schema: &DFSchema,
) -> Result<Cow<'f, Expr>> {
    let mut promote = HashSet::new();
    for c in wrt {
        let t = columns.field(c)?.data_type();
        match Shape::of(t) {
            Some(s) if s.data_type() == *t => {}
            Some(_) => {
                promote.insert(c.clone());
            }
            None => {
                return fail(
                    ErrorKind::UnsupportedType,
                    format!("cannot differentiate with respect to `{c}` of type {t}"),
                )
            }
        }
    }
    if promote.is_empty() {
        return Ok(Cow::Borrowed(f));
    }
    let f = f
        .clone()
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
            Expr::BinaryExpr(b)
                if matches!(b.op, Operator::Divide | Operator::Modulo)
                    && e.column_refs().iter().any(|c| promote.contains(*c)) =>
            {
                match e.get_type(schema)? {
                    t if t.is_integer() => {
                        Ok(Transformed::yes(Expr::Cast(Cast::new(Box::new(e), t))))
                    }
                    _ => Ok(Transformed::no(e)),
                }
            }
            _ => Ok(Transformed::no(e)),
        })?
        .data
        .transform_up(|e| match &e {
            Expr::Column(c) if promote.contains(c) => {
                let t = columns.field(c)?.data_type().clone();
                Ok(Transformed::yes(promoted(e, &t)))
            }
            _ => match into_marker(e) {
                Ok((kind, call)) => Ok(Transformed::yes(unpromote_wrt(kind, call, &promote))),
                Err(e) => Ok(Transformed::no(e)),
            },
        })?
        .data;
    let f = ExprSimplifier::new(SimplifyContext::default()).coerce(f, schema)?;
    Ok(Cow::Owned(f))
}

/// A nested marker call with the casts just added around its variables removed.
fn unpromote_wrt(kind: MarkerKind, call: ScalarFunction, promoted: &HashSet<Column>) -> Expr {
    let ScalarFunction { func, mut args } = call;
    for p in kind.wrt_positions(args.len()).unwrap_or_default() {
        if let Expr::Cast(c) = &args[p] {
            if matches!(c.expr.as_ref(), Expr::Column(v) if promoted.contains(v)) {
                args[p] = c.expr.as_ref().clone();
            }
        }
    }
    Expr::ScalarFunction(ScalarFunction { func, args })
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

/// `e` (of type `t`) as a Float64 number or tensor: itself, or a cast of it.
pub(crate) fn promoted(e: Expr, t: &DataType) -> Expr {
    match Shape::of(t).map(Shape::data_type) {
        Some(target) if target != *t => Expr::Cast(Cast::new(Box::new(e), target)),
        Some(_) => e,
        None => Expr::Cast(Cast::new(Box::new(e), DataType::Float64)),
    }
}
