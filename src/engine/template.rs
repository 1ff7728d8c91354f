//! A rule's partial derivatives, compiled once per shape of application.
//!
//! Calling a rule builds its partials as expression trees, which are then
//! interned node by node; on an expression with thousands of products that is
//! most of the work of a sweep. A [`Template`] is the rule's output for one
//! shell and one pattern of literal arguments, already interned into a small
//! graph over placeholder arguments: instantiating it for a node adds its
//! nodes, with the node's own arguments in place of the placeholders.

use datafusion::error::Result;
use datafusion::logical_expr::Expr;

use super::graph::{Graph, NodeId};
use crate::error::{fail, ErrorKind};
use crate::reserved::Placeholder;
use crate::rules::{Call, Partial};
use crate::tensor::Shape;

/// One partial derivative over placeholder arguments `0..arity`.
#[derive(Debug)]
pub(crate) struct Template {
    /// Nodes `0..arity` are the arguments; the others are built in order.
    graph: Box<Graph>,
    arity: usize,
    root: NodeId,
}

/// One compiled partial derivative.
#[derive(Debug)]
pub(crate) enum Local {
    /// A factor flows are multiplied by, and whether it selects (see
    /// [`Partial::Selected`]); over the arguments.
    Factor(Template, bool),
    /// A linear map ([`Partial::Linear`]): its reverse and forward forms,
    /// over the arguments and the flow (placeholder `arity`).
    Linear { vjp: Template, jvp: Template },
}

/// The partials of one rule application: `None` for a zero partial.
pub(crate) type Partials = Vec<Option<Local>>;

/// Compiles the partials that `rule` gives for `shell` applied to arguments
/// that are the literals `literals[i]` where given, and anything otherwise.
pub(crate) fn compile(
    key: &str,
    shell: &Expr,
    literals: &[Option<f64>],
    shapes: (Vec<Shape>, Shape),
    partials: impl FnOnce(&Call) -> Result<Vec<Partial>>,
) -> Result<Partials> {
    let arity = literals.len();
    let symbolic: Vec<Expr> = literals
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Some(v) => crate::rules::num(*v),
            None => Call::placeholder(i),
        })
        .collect();
    let call = Call::new(
        symbolic.clone(),
        super::graph::fill(shell.clone(), symbolic),
        shapes.0,
        shapes.1,
    );
    let partials = partials(&call)?;
    if partials.len() != arity {
        return fail(
            ErrorKind::NonDifferentiable,
            format!(
                "the rule for `{key}` returned {} partials for {arity} arguments",
                partials.len(),
            ),
        );
    }
    partials
        .into_iter()
        .map(|partial| {
            Ok(match partial {
                Partial::Zero => None,
                Partial::Value(e) => Some(Local::Factor(Template::new(key, e, arity)?, false)),
                Partial::Selected(e) => Some(Local::Factor(Template::new(key, e, arity)?, true)),
                Partial::Linear { vjp, jvp } => Some(Local::Linear {
                    vjp: Template::new(key, vjp, arity + 1)?,
                    jvp: Template::new(key, jvp, arity + 1)?,
                }),
            })
        })
        .collect()
}

impl Template {
    /// `expr` over the placeholders `0..arity`, interned.
    fn new(key: &str, expr: Expr, arity: usize) -> Result<Self> {
        let mut graph = Box::new(Graph::new());
        for i in 0..arity {
            graph.add(Call::placeholder(i), &[]);
        }
        let root = graph.intern(&expr, true, &mut |e| match e {
            Expr::Column(c) if Placeholder::Arg.claims(c) => match Placeholder::Arg.index(c) {
                Some(i) if i < arity => Ok(Some(i)),
                _ => fail(
                    ErrorKind::NonDifferentiable,
                    format!("the rule for `{key}` refers to a missing argument `{c}`"),
                ),
            },
            _ => Ok(None),
        })?;
        Ok(Self { graph, arity, root })
    }

    /// Adds this partial to `g` with `args` as its arguments; its node.
    pub(crate) fn instantiate(&self, g: &mut Graph, args: &[NodeId]) -> NodeId {
        let mut ids: Vec<NodeId> = Vec::with_capacity(self.graph.len());
        ids.extend_from_slice(&args[..self.arity]);
        let mut children = Vec::new();
        for id in self.arity..self.graph.len() {
            children.clear();
            children.extend(self.graph.args(id).iter().map(|&a| ids[a]));
            ids.push(g.copy_node(&self.graph, id, &children));
        }
        ids[self.root]
    }
}
