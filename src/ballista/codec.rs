//! The physical plan codec of our Ballista processes: Ballista's, plus the
//! operators of ours that travel from the scheduler to the executors
//! ([`KeptOnExecutorsExec`]).

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::HigherOrderUDF;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF, WindowUDF};
use datafusion::physical_expr_common::physical_expr::proto_decode::PhysicalExprDecodeCtx;
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
use datafusion::physical_plan::{ExecutionPlan, PhysicalExpr};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

use super::kept::KeptOnExecutorsExec;
use crate::plan::only_child;

/// What an encoded [`KeptOnExecutorsExec`] starts with (its run key follows):
/// a protobuf message (what Ballista's codec writes) never starts with a
/// zero byte.
const KEPT: &[u8] = b"\0datafusion_grad.kept:";

/// Ballista's physical extension codec with our operators added. Set on
/// the client ([`super::config`]), the scheduler and the executors
/// ([`super::cluster`]).
#[derive(Debug, Default)]
pub struct GradPhysicalCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for GradPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match buf.strip_prefix(KEPT) {
            Some(run) => {
                let run = String::from_utf8(run.to_vec()).map_err(|e| {
                    datafusion::error::DataFusionError::Internal(format!(
                        "KeptOnExecutorsExec run key: {e}"
                    ))
                })?;
                let input = only_child(inputs.to_vec(), "KeptOnExecutorsExec")?;
                Ok(Arc::new(KeptOnExecutorsExec::new(input, run)))
            }
            None => self.ballista.try_decode(buf, inputs, ctx, proto_converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        match node.downcast_ref::<KeptOnExecutorsExec>() {
            Some(kept) => {
                buf.extend_from_slice(KEPT);
                buf.extend_from_slice(kept.run().as_bytes());
                Ok(())
            }
            None => self.ballista.try_encode(node, buf, proto_converter),
        }
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.ballista.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode_udf(node, buf)
    }

    fn try_decode_higher_order_function(
        &self,
        name: &str,
        buf: &[u8],
    ) -> Result<Arc<HigherOrderUDF>> {
        self.ballista.try_decode_higher_order_function(name, buf)
    }

    fn try_encode_higher_order_function(
        &self,
        node: &HigherOrderUDF,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.ballista.try_encode_higher_order_function(node, buf)
    }

    fn try_decode_expr(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn PhysicalExpr>],
        ctx: &PhysicalExprDecodeCtx<'_>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        self.ballista.try_decode_expr(buf, inputs, ctx)
    }

    fn try_encode_expr(
        &self,
        node: &Arc<dyn PhysicalExpr>,
        buf: &mut Vec<u8>,
        ctx: &PhysicalExprEncodeCtx<'_>,
    ) -> Result<()> {
        self.ballista.try_encode_expr(node, buf, ctx)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        self.ballista.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        self.ballista.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode_udwf(node, buf)
    }
}
