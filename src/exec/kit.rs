//! What every operator writes alike, written once: the parts of
//! `impl ExecutionPlan` (and of `impl DisplayAs`) that say nothing about
//! what the operator does. Each is a macro used inside the operator's
//! `impl` block, so the block reads as the operator's own behaviour:
//!
//! ```ignore
//! impl ExecutionPlan for OverwriteExec {
//!     kit::one_input!("OverwriteExec");
//!     kit::own_properties!();
//!     kit::no_expressions!();
//!
//!     fn execute(&self, partition: usize, context: Arc<TaskContext>) -> … { … }
//! }
//! ```
//!
//! The paths inside are written in full, so an operator's file imports
//! only what its own code names.

/// `name`, `children` and `with_new_children` of an operator of one input,
/// its field `input`. `with_new_children` takes the one child (an internal
/// error otherwise) and rebuilds the operator through its own
/// `fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self>`,
/// which decides what a new input changes (its properties, its metrics).
macro_rules! one_input {
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
        }

        fn children(
            &self,
        ) -> Vec<&::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>> {
            vec![&self.input]
        }

        fn with_new_children(
            self: ::std::sync::Arc<Self>,
            children: Vec<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>>,
        ) -> ::datafusion::error::Result<
            ::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>,
        > {
            let input = $crate::exec::only_child(children, $name)?;
            Ok(::std::sync::Arc::new(self.with_input(input)?))
        }
    };
}

/// `name`, `children` and `with_new_children` of an operator without
/// inputs (a leaf: it reads what it was built with); a new set of children
/// must be empty, and the operator stays as it is.
macro_rules! no_input {
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
        }

        fn children(
            &self,
        ) -> Vec<&::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>> {
            vec![]
        }

        fn with_new_children(
            self: ::std::sync::Arc<Self>,
            children: Vec<::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>>,
        ) -> ::datafusion::error::Result<
            ::std::sync::Arc<dyn ::datafusion::physical_plan::ExecutionPlan>,
        > {
            match children.is_empty() {
                true => Ok(self),
                false => ::datafusion::common::internal_err!(concat!($name, " has no children")),
            }
        }
    };
}

/// `properties` of an operator that keeps its own, in its field
/// `properties`.
macro_rules! own_properties {
    () => {
        fn properties(&self) -> &::std::sync::Arc<::datafusion::physical_plan::PlanProperties> {
            &self.properties
        }
    };
}

/// `properties` of an operator whose output is its input's: the same
/// partitions, order and equivalences.
macro_rules! input_properties {
    () => {
        fn properties(&self) -> &::std::sync::Arc<::datafusion::physical_plan::PlanProperties> {
            self.input.properties()
        }
    };
}

/// `apply_expressions` of an operator that evaluates no physical
/// expressions of its own.
macro_rules! no_expressions {
    () => {
        fn apply_expressions(
            &self,
            _: &mut dyn FnMut(
                &::std::sync::Arc<dyn ::datafusion::physical_expr::PhysicalExpr>,
            ) -> ::datafusion::error::Result<
                ::datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> ::datafusion::error::Result<::datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(::datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }
    };
}

/// `metrics` of an operator that records them in its field `metrics` (an
/// `ExecutionPlanMetricsSet`).
macro_rules! own_metrics {
    () => {
        fn metrics(&self) -> Option<::datafusion::physical_plan::metrics::MetricsSet> {
            Some(self.metrics.clone_inner())
        }
    };
}

/// `impl DisplayAs` of an operator that `EXPLAIN` shows by its name alone.
macro_rules! display_name {
    ($operator:ident) => {
        impl ::datafusion::physical_plan::DisplayAs for $operator {
            fn fmt_as(
                &self,
                _: ::datafusion::physical_plan::DisplayFormatType,
                f: &mut ::std::fmt::Formatter,
            ) -> ::std::fmt::Result {
                f.write_str(stringify!($operator))
            }
        }
    };
}

pub(crate) use {
    display_name, input_properties, no_expressions, no_input, one_input, own_metrics,
    own_properties,
};
