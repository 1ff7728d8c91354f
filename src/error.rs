//! Typed errors of datafusion-grad.
//!
//! Every refusal is a [`GradError`] wrapped in
//! [`DataFusionError::External`], so callers can downcast it and match on its
//! [`ErrorKind`] whose [`ErrorKind::name`] is stable.
//!
//! ```
//! use datafusion::error::DataFusionError;
//! use datafusion_grad::{GradError, ErrorKind};
//!
//! let err: DataFusionError = GradError::non_differentiable("random", "it is volatile").into();
//! let grad_err = GradError::find(&err).unwrap();
//! assert_eq!(grad_err.kind(), ErrorKind::NonDifferentiable);
//! assert!(err.to_string().contains("random"));
//! ```

use std::fmt;

use datafusion::error::DataFusionError;

/// The stable category of a [`GradError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `f` calls a function or operator that has no derivative rule, or is volatile.
    NonDifferentiable,
    /// A `wrt` argument is not a column of the input (or is repeated).
    InvalidWrt,
    /// A marker was called with the wrong number of arguments.
    WrongArity,
    /// `f` depends on an aggregate, window or subquery output, which needs the plan rule.
    NeedsPlanContext,
    /// A `grad`/`jvp`/`vjp` call was not rewritten before execution.
    MarkerReachedExecution,
    /// An argument has a type that cannot be differentiated (e.g. a string).
    UnsupportedType,
    /// A derivative is too large to write out as self-contained expressions
    /// where its shared parts cannot be computed once.
    DerivativeTooLarge,
    /// A statement or expression cannot be exported faithfully as SQL text
    /// of the requested dialect (or the dialect is unknown).
    Unexportable,
    /// Tensor arguments have shapes a function cannot combine (e.g. a
    /// `matmul` of 2x3 by 4x5), or a list is not of the length asked for.
    ShapeMismatch,
    /// A tensor value cannot be computed with: a NULL element inside a
    /// non-NULL tensor, or a class label outside the logits' range.
    InvalidTensor,
    /// The tensor device setting asks for a device this process cannot
    /// use: `datafusion_grad.tensor_device = 'gpu'` in a build without the
    /// `cuda` feature, or where no CUDA driver or device was found.
    DeviceUnavailable,
    /// A Ballista cluster gave no answer within
    /// `datafusion_grad.ballista_timeout_seconds` (e.g. it lost its
    /// executors).
    ClusterTimeout,
    /// A recursive query still produced rows after
    /// `datafusion_grad.max_iterations` iterations.
    IterationLimit,
}

impl ErrorKind {
    /// Stable machine-readable name of the kind, e.g. `"non_differentiable"`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NonDifferentiable => "non_differentiable",
            ErrorKind::InvalidWrt => "invalid_wrt",
            ErrorKind::WrongArity => "wrong_arity",
            ErrorKind::NeedsPlanContext => "needs_plan_context",
            ErrorKind::MarkerReachedExecution => "marker_reached_execution",
            ErrorKind::UnsupportedType => "unsupported_type",
            ErrorKind::DerivativeTooLarge => "derivative_too_large",
            ErrorKind::Unexportable => "unexportable",
            ErrorKind::ShapeMismatch => "shape_mismatch",
            ErrorKind::InvalidTensor => "invalid_tensor",
            ErrorKind::DeviceUnavailable => "device_unavailable",
            ErrorKind::ClusterTimeout => "cluster_timeout",
            ErrorKind::IterationLimit => "iteration_limit",
        }
    }
}

/// An error raised while differentiating SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GradError {
    kind: ErrorKind,
    message: String,
}

impl GradError {
    /// A new error of `kind` with a human-readable `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// `function` has no derivative rule (or may not be differentiated), for `reason`.
    pub fn non_differentiable(function: &str, reason: &str) -> Self {
        Self::new(
            ErrorKind::NonDifferentiable,
            format!("cannot differentiate through `{function}`: {reason}"),
        )
    }

    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Finds a [`GradError`] inside a (possibly wrapped) [`DataFusionError`].
    pub fn find(err: &DataFusionError) -> Option<&GradError> {
        match err {
            DataFusionError::External(e) => e.downcast_ref::<GradError>(),
            DataFusionError::Context(_, inner) => GradError::find(inner),
            DataFusionError::Shared(inner) => GradError::find(inner),
            DataFusionError::Diagnostic(_, inner) => GradError::find(inner),
            DataFusionError::Collection(errs) => errs.iter().find_map(GradError::find),
            _ => None,
        }
    }
}

impl fmt::Display for GradError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.kind.name(), self.message)
    }
}

impl std::error::Error for GradError {}

impl From<GradError> for DataFusionError {
    fn from(err: GradError) -> Self {
        DataFusionError::External(Box::new(err))
    }
}

/// Shorthand: a `Result` that fails with a [`GradError`] of `kind`.
/// A hint for an error that DataFusion itself raises where users of `grad`
/// meet it, naming the fix; `None` for other errors. `dfgrad` prints it
/// after the message.
pub fn hint(err: &DataFusionError) -> Option<&'static str> {
    let text = err.to_string();
    if text.contains("RecursionLimitExceeded") {
        Some(
            "the SQL nests more calls than datafusion.sql_parser.recursion_limit allows (50 by \
             default): raise it, e.g. SET datafusion.sql_parser.recursion_limit = 500",
        )
    } else if text.contains("must appear in the GROUP BY clause") {
        Some(
            "a column read outside an aggregate must be a GROUP BY key, the variable x of \
             grad(aggregate, x) too: a group's aggregate is differentiated with respect to its \
             key; with respect to every row's x, compute the aggregate as a loss in a CTE and \
             write SELECT key, grad((SELECT loss FROM cte), x) FROM the rows of x",
        )
    } else {
        None
    }
}

pub(crate) fn fail<T>(kind: ErrorKind, message: impl Into<String>) -> datafusion::error::Result<T> {
    Err(GradError::new(kind, message).into())
}
