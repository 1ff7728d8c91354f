//! What is known of a number's sign, from the shape of its expression.
//!
//! `sqrt` raises an error for a negative number and `power` for zero to a
//! negative power (in DataFusion and in PostgreSQL), so such a call is only
//! computed where `f` computes it — never bound to a column computed on every
//! row ([`super::share`]) — unless its argument is known to be in the
//! domain: `sqrt(0.5 + x * x)`, `power(1.2 + x * x, y)` and every power the
//! derivative of the latter writes (`power(1.2 + x * x, y - 1)`) can be.
//!
//! The analysis is exact in IEEE arithmetic (rounding, overflow to `inf`
//! and underflow to 0 included), and NaN and NULL count as in every sign:
//! neither raises an error in `sqrt` or `power`.

use datafusion::logical_expr::{Expr, Operator};

use super::graph::NodeId;
use super::primitive::{self, is_float};
use super::workspace::Workspace;

/// What is known of a number's sign (the order is "knows more").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sign {
    /// Nothing.
    Unknown,
    /// `≥ 0` (possibly `-0.0`), NaN or NULL.
    NonNegative,
    /// `> 0`, NaN or NULL.
    Positive,
}

impl Workspace<'_> {
    /// What is known of the sign of node `id`'s value.
    // pub for the tests in tests/unit/engine_sign.rs
    #[doc(hidden)]
    pub fn sign(&mut self, id: NodeId) -> Sign {
        if let Some(&known) = self.signs.get(&id) {
            return known;
        }
        let known = |ws: &Self, n| ws.signs.contains_key(&n);
        self.classify(id, known, |ws, n| {
            let sign = ws.sign_of_node(n);
            ws.signs.insert(n, sign);
            Ok(())
        })
        .expect("a sign is always known");
        self.signs[&id]
    }

    /// The sign of node `n` from its children's (already known).
    fn sign_of_node(&mut self, n: NodeId) -> Sign {
        use Sign::*;
        if let Some(v) = self.literal_value(n) {
            return match v {
                v if v > 0.0 => Positive,
                v if v >= 0.0 => NonNegative,
                _ => Unknown,
            };
        }
        // Only floating-point values: integer arithmetic wraps around.
        if !self.data_type(n).is_ok_and(|t| is_float(&t)) {
            return Unknown;
        }
        let args = self.g.args(n).to_vec();
        let arg = |i: usize| self.signs[&args[i]];
        match self.g.shell(n) {
            // a > 0 and b ≥ 0: a + b ≥ a (rounding is monotonic)
            Expr::BinaryExpr(b) if b.op == Operator::Plus => match arg(0).min(arg(1)) {
                NonNegative => arg(0).max(arg(1)),
                _ => Unknown,
            },
            // a · a, or a product of non-negative numbers (which may
            // underflow to 0, so not positive)
            Expr::BinaryExpr(b) if b.op == Operator::Multiply => {
                match args[0] == args[1] || arg(0).min(arg(1)) >= NonNegative {
                    true => NonNegative,
                    false => Unknown,
                }
            }
            // a ≥ 0 over b > 0 (not over -0.0, which gives -inf)
            Expr::BinaryExpr(b) if b.op == Operator::Divide => {
                match arg(0) >= NonNegative && arg(1) == Positive {
                    true => NonNegative,
                    false => Unknown,
                }
            }
            Expr::Cast(_) => self.signs[&args[0]],
            // every result: the branches (and ELSE; a missing ELSE is NULL)
            shell @ Expr::Case(_) => (0..args.len())
                .filter(|&i| primitive::differentiated(shell, i))
                .map(|i| self.signs[&args[i]])
                .min()
                .unwrap_or(Unknown),
            Expr::ScalarFunction(f) => match f.func.name() {
                // exp underflows to 0; sqrt(-0.0) is -0.0, still ≥ 0
                "abs" | "exp" | "sqrt" => NonNegative,
                "cosh" => Positive,
                // a non-negative base gives a non-negative power
                "power" | "pow" if arg(0) >= NonNegative => NonNegative,
                "coalesce" => (0..args.len()).map(arg).min().unwrap_or(Unknown),
                _ => Unknown,
            },
            _ => Unknown,
        }
    }
}
