//! A bound on how long the client waits for a Ballista job.
//!
//! Ballista's client polls the scheduler until a job ends, without a limit:
//! when the cluster loses its executors (killed, or declared dead under
//! load) a queued job waits for executors that never come, and the client
//! with it. [`DeadlineExec`] wraps the plan the client runs and fails it
//! with a typed [`ErrorKind::ClusterTimeout`] error once
//! `datafusion_grad.ballista_timeout_seconds` have passed since it started
//! (`0`: no bound):
//!
//! ```sql
//! SET datafusion_grad.ballista_timeout_seconds = 3600;
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::error::{ErrorKind, GradError};
use crate::exec::kit;

/// Runs its child, failing with [`ErrorKind::ClusterTimeout`] when a
/// partition's stream has not ended `timeout` after `execute`.
#[derive(Debug)]
pub struct DeadlineExec {
    input: Arc<dyn ExecutionPlan>,
    timeout: Duration,
}

impl DeadlineExec {
    /// `input` bounded by `seconds` (`0`: `input` itself, unbounded).
    pub fn wrap(input: Arc<dyn ExecutionPlan>, seconds: u64) -> Arc<dyn ExecutionPlan> {
        if seconds == 0 {
            return input;
        }
        Arc::new(Self {
            input,
            timeout: Duration::from_secs(seconds),
        })
    }
}

impl DeadlineExec {
    /// The same deadline over `input`.
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Ok(Self {
            input,
            timeout: self.timeout,
        })
    }
}

impl DisplayAs for DeadlineExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DeadlineExec: timeout={}s", self.timeout.as_secs())
    }
}

impl ExecutionPlan for DeadlineExec {
    kit::one_input!("DeadlineExec");
    kit::input_properties!();
    kit::no_expressions!();

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let deadline = tokio::time::Instant::now() + self.timeout;
        let seconds = self.timeout.as_secs();
        // Ends after the input ends, or after the one timeout error.
        let stream = futures::stream::unfold(Some(input), move |input| async move {
            let mut input = input?;
            match tokio::time::timeout_at(deadline, input.next()).await {
                Ok(Some(batch)) => Some((batch, Some(input))),
                Ok(None) => None,
                Err(_) => Some((Err(timeout_error(seconds).into()), None)),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

fn timeout_error(seconds: u64) -> GradError {
    GradError::new(
        ErrorKind::ClusterTimeout,
        format!(
            "the Ballista cluster gave no answer within {seconds} s (are its executors alive?); \
             raise the bound with SET datafusion_grad.ballista_timeout_seconds = N (0: no bound)"
        ),
    )
}
