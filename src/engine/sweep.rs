//! One sweep of accumulation over a [`Workspace`]'s DAG: reverse mode
//! (adjoints, for `grad` and `vjp`) or forward mode (tangents, for `jvp`),
//! with the partials of each node taken from the rule table.

use std::rc::Rc;

use datafusion::common::{Column, HashMap};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, Operator};

use super::graph::{NodeId, NodeMap};
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

/// An adjoint or tangent: a node, and the guard of its path — a condition
/// ([`super::guard`]) that holds on the rows where every selection along the
/// path (`CASE` branch, `greatest` argument, …) is taken; `None` when it is
/// every row. The node's value counts only where the guard holds, and it is
/// evaluated only there.
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
                Ok((map.instantiate(&mut self.ws.g, &with_flow), flow.1))
            }
        }
    }

    /// The flow `flow · p` along one edge.
    ///
    /// A guarded flow's node counts only where its guard holds: it is
    /// evaluated only there, once, where the flow ends — in a
    /// `CASE WHEN guard THEN … ELSE 0 END` of a sum ([`Sweep::sum`]) or of
    /// the derivative — so `p` may be any partial, also one that raises an
    /// error off the branch its guard selects (`sqrt` of a negative number
    /// in an unselected branch is never evaluated), and no guard is tested
    /// again inside it. When `p` selects (is NULL off its branch), the guard
    /// narrows by the atom that `p` is not NULL ([`Workspace::selected`]),
    /// and where `p` is 1 wherever it is not NULL (a `CASE` branch's
    /// indicator) the flow passes unchanged: `flow · 1` is `flow`. Guards are
    /// built from selection conditions only, never from flows, so no flow is
    /// duplicated in the emitted expression.
    fn product(&mut self, (flow, guard): Flow, (p, selects): Factor) -> Result<Flow> {
        if selects && self.ws.is_unit_selection(p) {
            let on_branch = self.ws.selected(p);
            return Ok((flow, Some(self.ws.guard_and(guard, on_branch))));
        }
        // A tensor's flow through a number factor (a `CASE` branch's
        // indicator) is scaled by it.
        let term = match Shape::is_tensor_type(&self.ws.data_type(flow)?) {
            true => self.ws.scale(flow, p),
            false => self.ws.g.binary(Operator::Multiply, flow, p),
        };
        if !selects {
            return Ok((term, guard));
        }
        let on_branch = self.ws.selected(p);
        Ok((term, Some(self.ws.guard_and(guard, on_branch))))
    }

    /// Sums flows into node `like`'s (of its shape); off its guard, a term
    /// counts as 0. When every term is guarded, the sum is guarded by the
    /// disjunction of the guards, and a term guarded by that disjunction
    /// itself is summed as it is.
    fn sum(&mut self, terms: Vec<Flow>, like: NodeId) -> Result<Flow> {
        if terms.len() == 1 {
            return Ok(terms[0]);
        }
        let tensor = Shape::is_tensor_type(&self.ws.data_type(like)?);
        let guards: Option<Vec<NodeId>> = terms.iter().map(|&(_, g)| g).collect();
        let union = guards.map(|g| self.ws.guard_or(&g));
        let mut ids = Vec::with_capacity(terms.len());
        for (t, guard) in terms {
            ids.push(match guard {
                Some(g) if Some(g) != union => self.ws.zero_off(g, t, like)?,
                _ => t,
            });
        }
        let total = ids
            .into_iter()
            .reduce(|a, b| match tensor {
                true => self.ws.tensor_add(a, b),
                false => self.ws.g.binary(Operator::Plus, a, b),
            })
            .expect("at least one term");
        Ok((total, union))
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
