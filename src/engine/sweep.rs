//! One sweep of accumulation over a [`Workspace`]'s DAG: reverse mode
//! (adjoints, for `grad` and `vjp`) or forward mode (tangents, for `jvp`),
//! with the partials of each node taken from the rule table.

use std::rc::Rc;

use datafusion::common::{Column, HashMap, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, Operator};

use super::graph::{self, NodeId, NodeMap};
use super::primitive;
use super::template::{Local, Partials};
use super::workspace::Workspace;
use crate::tensor::Shape;

/// The state of one differentiation of the node `root`.
pub(crate) struct Sweep<'w, 'a> {
    pub(crate) ws: &'w mut Workspace<'a>,
    root: NodeId,
    wrt: Vec<NodeId>,
    /// The index of each variable's node in `wrt`.
    position: NodeMap<usize>,
    active: Vec<bool>,
}

/// An adjoint or tangent: a node, and the guard of its path — a boolean node
/// that is true on the rows where every selection along the path (`CASE`
/// branch, `greatest` argument, …) is taken; `None` when it is every row.
pub(crate) type Flow = (NodeId, Option<NodeId>);

/// A local partial derivative: a node, and whether it selects (is NULL on the
/// rows where its argument is not the one selected).
type Factor = (NodeId, bool);

impl<'w, 'a> Sweep<'w, 'a> {
    /// A sweep over `root` with respect to the columns `wrt`.
    pub(crate) fn new(ws: &'w mut Workspace<'a>, root: NodeId, wrt: &[Column]) -> Result<Self> {
        let mut wrt_ids = Vec::with_capacity(wrt.len());
        for c in wrt {
            let column = ws.g.add(Expr::Column(c.clone()), &[]);
            wrt_ids.push(ws.value(column)?);
        }
        let mut position = NodeMap::default();
        for (k, &id) in wrt_ids.iter().enumerate().rev() {
            position.insert(id, k);
        }
        let g = &ws.g;
        let mut active = vec![false; g.len()];
        for id in 0..g.len() {
            let shell = g.shell(id);
            primitive::check_volatility(shell)?;
            active[id] = position.contains_key(&id)
                || (!primitive::blocks(shell)
                    && g.args(id)
                        .iter()
                        .enumerate()
                        .any(|(i, &a)| active[a] && primitive::differentiated(shell, i)));
        }
        Ok(Self {
            ws,
            root,
            wrt: wrt_ids,
            position,
            active,
        })
    }

    /// The variables' nodes, in order.
    pub(crate) fn variables(&self) -> &[NodeId] {
        &self.wrt
    }

    fn is_active(&self, id: NodeId) -> bool {
        self.active.get(id).copied().unwrap_or(false)
    }

    /// Reverse accumulation from the root seeded with `seed`; one flow per variable.
    pub(crate) fn reverse(&mut self, seed: Flow) -> Result<Vec<Flow>> {
        let mut results = Vec::with_capacity(self.wrt.len());
        for &w in &self.wrt.clone() {
            results.push((self.ws.zero_like(w)?, None));
        }
        if !self.is_active(self.root) {
            return Ok(results);
        }
        let mut incoming: Vec<Vec<Flow>> = vec![Vec::new(); self.root + 1];
        incoming[self.root].push(seed);
        for id in (0..=self.root).rev() {
            let terms = std::mem::take(&mut incoming[id]);
            if terms.is_empty() {
                continue;
            }
            let adjoint = self.sum(terms, id)?;
            if let Some(&k) = self.position.get(&id) {
                results[k] = adjoint;
                continue;
            }
            let (partials, values) = self.partials(id)?;
            for (i, partial) in partials.iter().enumerate() {
                let arg = self.ws.g.args(id)[i];
                if let (true, Some(p)) = (self.is_active(arg), partial) {
                    let term = self.apply(adjoint, p, &values, true)?;
                    incoming[arg].push(term);
                }
            }
        }
        Ok(results)
    }

    /// Forward accumulation with one tangent per variable; the root's tangent.
    pub(crate) fn forward(&mut self, tangents: &[NodeId]) -> Result<Flow> {
        let mut needed = vec![false; self.root + 1];
        needed[self.root] = self.is_active(self.root);
        for id in (0..=self.root).rev() {
            if !needed[id] || self.position.contains_key(&id) {
                continue;
            }
            let shell = self.ws.g.shell(id).clone();
            for (i, &a) in self.ws.g.args(id).iter().enumerate() {
                if self.is_active(a) && primitive::differentiated(&shell, i) {
                    needed[a] = true;
                }
            }
        }
        let mut tangent: HashMap<NodeId, Flow> = HashMap::new();
        let order: Vec<NodeId> = (0..=self.root).filter(|&id| needed[id]).collect();
        for id in order {
            if let Some(&k) = self.position.get(&id) {
                tangent.insert(id, (tangents[k], None));
                continue;
            }
            let args = self.ws.g.args(id).to_vec();
            let (partials, values) = self.partials(id)?;
            let mut terms = Vec::new();
            for (arg, partial) in args.into_iter().zip(partials.iter()) {
                if let (Some(&t), Some(p)) = (tangent.get(&arg), partial) {
                    terms.push(self.apply(t, p, &values, false)?);
                }
            }
            let flow = if terms.is_empty() {
                (self.ws.zero_like(id)?, None)
            } else {
                self.sum(terms, id)?
            };
            tangent.insert(id, flow);
        }
        match tangent.get(&self.root) {
            Some(&flow) => Ok(flow),
            None => Ok((self.ws.zero_like(self.root)?, None)),
        }
    }

    /// The flow along one edge: `flow · p` for a factor, the rule's linear
    /// map applied to `flow` (its `vjp` in reverse mode, else its `jvp`).
    fn apply(
        &mut self,
        flow: Flow,
        local: &Local,
        values: &[NodeId],
        reverse: bool,
    ) -> Result<Flow> {
        match local {
            Local::Factor(t, selects) => {
                let p = t.instantiate(&mut self.ws.g, values);
                self.product(flow, (p, *selects))
            }
            Local::Linear { vjp, jvp } => {
                let map = if reverse { vjp } else { jvp };
                let mut with_flow = values.to_vec();
                with_flow.push(flow.0);
                let mut term = map.instantiate(&mut self.ws.g, &with_flow);
                if let Some(g) = flow.1 {
                    if !self.ws.is_safe(term)? {
                        term = self.ws.case_when(g, term, None);
                    }
                }
                Ok((term, flow.1))
            }
        }
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
    fn product(&mut self, (flow, guard): Flow, (p, selects): Factor) -> Result<Flow> {
        // A tensor's flow through a number factor (a `CASE` branch's
        // indicator) is scaled by it.
        let mut term = match Shape::is_tensor_type(&self.ws.data_type(flow)?) {
            true => self.ws.scale(flow, p),
            false => self.ws.g.binary(Operator::Multiply, flow, p),
        };
        if let Some(g) = guard {
            if self.ws.g.number(term) != Some(0.0) && !self.ws.is_safe(p)? {
                term = self.ws.case_when(g, term, None);
            }
        }
        if !selects {
            return Ok((term, guard));
        }
        let on_branch = self
            .ws
            .g
            .add(Expr::IsNotNull(Box::new(graph::hole())), &[p]);
        let guard = match guard {
            None => on_branch,
            Some(g) => {
                let no = self
                    .ws
                    .g
                    .add(Expr::Literal(ScalarValue::Boolean(Some(false)), None), &[]);
                self.ws.case_when(g, on_branch, Some(no))
            }
        };
        Ok((term, Some(guard)))
    }

    /// Sums flows into node `like`'s (of its shape); off its guard, a term
    /// counts as 0. When every term is guarded, the sum is guarded by the
    /// union of the guards (and NULL off it).
    fn sum(&mut self, terms: Vec<Flow>, like: NodeId) -> Result<Flow> {
        if terms.len() == 1 {
            return Ok(terms[0]);
        }
        let tensor = Shape::is_tensor_type(&self.ws.data_type(like)?);
        let mut guards: Vec<NodeId> = Vec::new();
        let mut all_guarded = true;
        let mut ids = Vec::with_capacity(terms.len());
        for (t, guard) in terms {
            match guard {
                Some(g) => {
                    if !guards.contains(&g) {
                        guards.push(g);
                    }
                    ids.push(self.ws.zero_off(g, t, like)?);
                }
                None => {
                    all_guarded = false;
                    ids.push(t);
                }
            }
        }
        let total = ids
            .into_iter()
            .reduce(|a, b| match tensor {
                true => self.ws.tensor_add(a, b),
                false => self.ws.g.binary(Operator::Plus, a, b),
            })
            .expect("at least one term");
        if !all_guarded {
            return Ok((total, None));
        }
        let guard = guards
            .into_iter()
            .reduce(|a, b| self.ws.g.binary(Operator::Or, a, b))
            .expect("at least one guard");
        Ok((self.ws.case_when(guard, total, None), Some(guard)))
    }

    /// The compiled partials of node `id` and the values they take as
    /// arguments. The rule's output is compiled once per shell, pattern of
    /// literal arguments and argument shapes ([`template`]) and instantiated
    /// for each node.
    fn partials(&mut self, id: NodeId) -> Result<(Rc<Partials>, Vec<NodeId>)> {
        let arity = self.ws.g.args(id).len();
        let mut literals = Vec::with_capacity(arity);
        let mut shapes = Vec::with_capacity(arity);
        // Numbers enter partials as Float64, tensors as Float64 tensors;
        // other arguments (CASE conditions) as they are.
        let mut values: Vec<NodeId> = Vec::with_capacity(arity);
        for i in 0..arity {
            let a = self.ws.g.args(id)[i];
            literals.push(self.ws.literal_value(a));
            let t = self.ws.data_type(a)?;
            let shape = Shape::of(&t);
            shapes.push(shape.unwrap_or(Shape::Scalar));
            values.push(if shape.is_some() {
                self.ws.value(a)?
            } else {
                a
            });
        }
        let out = Shape::of(&self.ws.data_type(id)?).unwrap_or(Shape::Scalar);
        let templates = self.ws.templates(id, &literals, (shapes, out))?;
        Ok((templates, values))
    }
}
