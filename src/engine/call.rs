//! What the engine knows of a marker call (`grad`, `jvp`, `vjp`): its kind,
//! where its variables are, the seed it asks for and the names of a
//! struct result. The SQL functions themselves (their `ScalarUDFImpl`) are
//! in `src/marker.rs`; the plan-level rewrites and the engine recognise a
//! call with [`as_marker`].
//!
//! ```sql
//! SELECT grad(x * x * y, x, y)['y'] FROM t;   -- reverse mode, a struct of partials
//! SELECT jvp(x * y, x, 1.0, y, 2.0) FROM t;   -- forward mode along (1, 2)
//! SELECT vjp(sin(x), x, 3.0) FROM t;          -- reverse mode with a cotangent
//! ```

use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};

use datafusion::common::tree_node::TreeNode;
use datafusion::common::Column;
use datafusion::error::Result;
use datafusion::functions::core::expr_fn::named_struct;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{lit, Expr, Signature, Volatility};

use super::Seed;
use crate::error::{fail, ErrorKind};
use crate::rules::Rules;

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
    /// Every kind, in the order of their SQL names' documentation.
    pub const ALL: [MarkerKind; 3] = [MarkerKind::Grad, MarkerKind::Jvp, MarkerKind::Vjp];

    /// The SQL function name.
    pub fn name(self) -> &'static str {
        match self {
            MarkerKind::Grad => "grad",
            MarkerKind::Jvp => "jvp",
            MarkerKind::Vjp => "vjp",
        }
    }

    /// Whether `name` is the SQL name of a marker.
    pub fn is_marker_name(name: &str) -> bool {
        Self::ALL
            .iter()
            .any(|k| k.name().eq_ignore_ascii_case(name))
    }

    fn usage(self) -> &'static str {
        match self {
            MarkerKind::Grad => "grad(f, x1 [, x2 …])",
            MarkerKind::Jvp => "jvp(f, x1, t1 [, x2, t2 …])",
            MarkerKind::Vjp => "vjp(f, x1, u [, x2 …])",
        }
    }

    /// Positions of the variables among the arguments, checking the arity.
    pub fn wrt_positions(self, n: usize) -> Result<Vec<usize>> {
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

    /// The variables of a call with `args` that are columns (none when the
    /// arity is wrong: the marker itself reports that).
    pub fn wrt_columns(self, args: &[Expr]) -> Vec<Column> {
        self.wrt_positions(args.len())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| match args.get(p) {
                Some(Expr::Column(c)) => Some(c.clone()),
                _ => None,
            })
            .collect()
    }

    /// The variables and the seed of a call with `args`, checked.
    pub fn request(self, args: &[Expr]) -> Result<(Vec<Column>, Seed)> {
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
    pub fn struct_names<'a>(self, names: impl Iterator<Item = &'a str>) -> Result<Vec<String>> {
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

    /// The value of a call of this kind with `args`, from the total
    /// derivative with respect to each of its variables (named `names`):
    /// `grad` one of them or a struct, `vjp` each times the cotangent, `jvp`
    /// their sum weighted by the tangents.
    pub fn assemble<'a>(
        self,
        args: &[Expr],
        names: impl Iterator<Item = &'a str>,
        totals: Vec<Expr>,
    ) -> Result<Expr> {
        Ok(match self {
            MarkerKind::Grad | MarkerKind::Vjp => {
                let totals: Vec<Expr> = match self {
                    MarkerKind::Vjp => totals.into_iter().map(|t| args[2].clone() * t).collect(),
                    _ => totals,
                };
                if totals.len() == 1 {
                    totals.into_iter().next().expect("one total")
                } else {
                    named_struct(
                        self.struct_names(names)?
                            .into_iter()
                            .zip(totals)
                            .flat_map(|(n, t)| [lit(n), t])
                            .collect(),
                    )
                }
            }
            MarkerKind::Jvp => totals
                .into_iter()
                .enumerate()
                .map(|(i, t)| args[2 * i + 2].clone() * t)
                .reduce(|a, b| a + b)
                .expect("at least one variable"),
        })
    }
}

/// A `grad`/`jvp`/`vjp` function: its kind and the rule table it
/// differentiates with. Its `ScalarUDFImpl` is in `src/marker.rs`.
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
    pub fn nulls_like(&self) -> &[(usize, usize)] {
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

    /// The signature of its SQL function: any arguments.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }
}

/// A marker call found by [`as_marker`]: the marker and its arguments.
#[derive(Debug, Clone, Copy)]
pub struct MarkerCall<'a> {
    /// The marker called.
    pub marker: &'a Marker,
    /// Its arguments: `f`, then variables (and tangents or a cotangent).
    pub args: &'a [Expr],
}

impl MarkerCall<'_> {
    /// Which derivative the call asks for.
    pub fn kind(&self) -> MarkerKind {
        self.marker.kind
    }

    /// The variables that are columns (see [`MarkerKind::wrt_columns`]).
    pub fn wrt_columns(&self) -> Vec<Column> {
        self.kind().wrt_columns(self.args)
    }
}

/// The marker call `expr` is, if it is one.
pub fn as_marker(expr: &Expr) -> Option<MarkerCall<'_>> {
    match expr {
        Expr::ScalarFunction(f) => Some(MarkerCall {
            marker: f.func.inner().downcast_ref::<Marker>()?,
            args: &f.args,
        }),
        _ => None,
    }
}

/// `expr` taken apart when it is a marker call: its kind and the call;
/// otherwise `expr` itself back.
pub fn into_marker(expr: Expr) -> std::result::Result<(MarkerKind, ScalarFunction), Expr> {
    match expr {
        Expr::ScalarFunction(f) => match f.func.inner().downcast_ref::<Marker>() {
            Some(m) => Ok((m.kind, f)),
            None => Err(Expr::ScalarFunction(f)),
        },
        other => Err(other),
    }
}

/// Whether `e` holds a marker call.
pub fn has_marker(e: &Expr) -> bool {
    e.exists(|e| Ok(as_marker(e).is_some())).unwrap_or(false)
}
