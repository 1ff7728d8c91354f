//! The GPU path of the matrix products (cargo feature `cuda`), through SQL:
//! `SET datafusion_grad.tensor_device = 'gpu' | 'auto' | 'cpu'`.
//!
//! Without a CUDA device, `gpu` must be a `device_unavailable` error and
//! `auto` must quietly give the CPU's results; with one, `gpu` must give the
//! CPU's results within 1e-12 (relative to the largest magnitude), gradients
//! of an MLP included. Tests that need a device print `skipped: no CUDA
//! device` and pass without one. (sql-tests/device.slt covers builds without
//! the feature.)
#![cfg(feature = "cuda")]

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use datafusion_grad::tensor::cuda;
use datafusion_grad::{ErrorKind, GradError};

use crate::common::gpu::{assert_close, no_device};

/// Every number in `array` (nested lists and structs flattened in order).
fn flatten(array: &ArrayRef, out: &mut Vec<f64>) {
    match array.data_type() {
        DataType::Float64 => out.extend(array.as_primitive::<Float64Type>().iter().flatten()),
        DataType::FixedSizeList(..) => flatten(array.as_fixed_size_list().values(), out),
        DataType::Struct(_) => {
            // Row by row, field by field, as a reader would.
            let s = array.as_struct();
            for row in 0..s.len() {
                for column in s.columns() {
                    flatten(&column.slice(row, 1), out);
                }
            }
        }
        t if t.is_numeric() => {
            let cast = datafusion::arrow::compute::cast(array, &DataType::Float64).unwrap();
            flatten(&cast, out)
        }
        t => panic!("unexpected result type {t}"),
    }
}

/// The numbers of `sql`'s result, row by row.
async fn numbers(ctx: &SessionContext, sql: &str) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for batch in ctx.sql(sql).await?.collect().await? {
        for row in 0..batch.num_rows() {
            for column in batch.columns() {
                flatten(&column.slice(row, 1), &mut out);
            }
        }
    }
    Ok(out)
}

async fn set_device(ctx: &SessionContext, device: &str) {
    ctx.sql(&format!("SET datafusion_grad.tensor_device = '{device}'"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
}

/// Products of every form, on several rows, with a constant operand; large
/// enough (64×4096 by 4096×64) that `auto` would pick a GPU.
const PRODUCTS: &str = "
WITH t AS (SELECT value AS i, random_tensor(value, 64, 4096) AS a, random_tensor(value + 10, 4096, 64) AS b
           FROM generate_series(0, 2))
SELECT i, matmul(a, b), matmul_tn(b, b), matmul_nt(a, a), matmul(a, random_tensor(99, 4096, 3)),
       matmul_tn(random_tensor(98, 3, 7), random_tensor(97, 3, 5))
FROM t ORDER BY i";

#[tokio::test]
async fn forced_gpu_without_a_device_is_device_unavailable() {
    if cuda::available() {
        println!(
            "skipped: a CUDA device is present ({:?})",
            cuda::device_name()
        );
        return;
    }
    let ctx = datafusion_grad::session_context();
    set_device(&ctx, "gpu").await;
    for sql in [
        "SELECT matmul(random_tensor(1, 2, 3), random_tensor(2, 3, 4))",
        "SELECT matmul_tn(random_tensor(1, 3, 2), random_tensor(2, 3, 4))",
        "SELECT matmul_nt(random_tensor(1, 2, 3), random_tensor(2, 4, 3))",
    ] {
        let err = numbers(&ctx, sql).await.unwrap_err();
        let grad = GradError::find(&err).unwrap_or_else(|| panic!("not a GradError: {err}"));
        assert_eq!(grad.kind(), ErrorKind::DeviceUnavailable, "{err}");
        assert!(
            grad.message().contains("no CUDA device/driver was found"),
            "{err}"
        );
    }
    // Other tensor functions stay on the CPU.
    let v = numbers(
        &ctx,
        "SELECT matvec(tensor([1.0, 2.0, 3.0, 4.0], 2, 2), tensor([1.0, 1.0], 2))",
    )
    .await
    .unwrap();
    assert_eq!(v, [3.0, 7.0]);
}

#[tokio::test]
async fn auto_gives_the_cpu_results() {
    // Without a device `auto` is the CPU (identical results); with one it
    // may use the GPU for these sizes (results within tolerance).
    let ctx = datafusion_grad::session_context();
    set_device(&ctx, "cpu").await;
    let cpu = numbers(&ctx, PRODUCTS).await.unwrap();
    set_device(&ctx, "auto").await;
    let auto = numbers(&ctx, PRODUCTS).await.unwrap();
    if cuda::available() {
        assert_close("auto vs cpu", &auto, &cpu);
    } else {
        assert_eq!(auto, cpu);
    }
}

#[tokio::test]
async fn forced_gpu_products_match_the_cpu() {
    // Small, non-square, one row and one column.
    let small = "SELECT matmul(tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3), tensor([1.0, 0.0, 2.0, 1.0, 0.0, 3.0], 3, 2)), \
                 matmul(tensor([1.0, 2.0, 3.0], 1, 3), tensor([1.0, 2.0, 3.0], 3, 1)), \
                 matmul_nt(tensor([1.0, 2.0, 3.0], 3, 1), tensor([1.0, 2.0], 2, 1))";
    let expected = [5.0, 11.0, 14.0, 23.0, 14.0, 1.0, 2.0, 2.0, 4.0, 3.0, 6.0];
    let ctx = datafusion_grad::session_context();
    set_device(&ctx, "cpu").await;
    // 3 rows × (i, 4 products of 64×64, a 64×3 and a 7×5)
    let cpu = numbers(&ctx, PRODUCTS).await.unwrap();
    assert_eq!(cpu.len(), 3 * (1 + 3 * 64 * 64 + 64 * 3 + 7 * 5));
    assert_eq!(numbers(&ctx, small).await.unwrap(), expected);
    if no_device() {
        return;
    }
    set_device(&ctx, "gpu").await;
    let gpu = numbers(&ctx, PRODUCTS).await.unwrap();
    assert_close("products, gpu vs cpu", &gpu, &cpu);
    assert_eq!(numbers(&ctx, small).await.unwrap(), expected);
}

/// Three batches of 64 samples for a 32-16-4 MLP whose loss and gradients of
/// all four parameters [`MLP`] computes (matmul forward, matmul_tn and
/// matmul_nt backward).
const MLP_DATA: &str = "
CREATE TABLE data AS
SELECT b AS batch, random_tensor(b + 10, 64, 32) AS x,
       tensor(array_agg(CAST((j * 7 + b) % 4 AS DOUBLE) ORDER BY j), 64) AS y
FROM (SELECT value AS b FROM generate_series(0, 2)), (SELECT value AS j FROM generate_series(0, 63))
GROUP BY b";

/// The loss and gradients of the MLP on each batch of [`MLP_DATA`].
const MLP: &str = "
WITH params AS (
  SELECT scale(random_tensor(1, 32, 16), 0.3) AS w1, scale(random_tensor(3, 16), 0.1) AS b1,
         scale(random_tensor(2, 16, 4), 0.5) AS w2, scale(random_tensor(4, 4), 0.1) AS b2
)
SELECT batch,
       cross_entropy(tensor_add(matmul(relu(tensor_add(matmul(x, w1), b1)), w2), b2), y) AS loss,
       grad(cross_entropy(tensor_add(matmul(relu(tensor_add(matmul(x, w1), b1)), w2), b2), y),
            w1, b1, w2, b2) AS g
FROM data CROSS JOIN params
ORDER BY batch";

#[tokio::test]
async fn mlp_gradients_on_the_gpu_match_the_cpu() {
    let ctx = datafusion_grad::session_context();
    ctx.sql(MLP_DATA).await.unwrap().collect().await.unwrap();
    set_device(&ctx, "cpu").await;
    let cpu = numbers(&ctx, MLP).await.unwrap();
    // 3 batches × (batch, loss, 32·16 + 16 + 16·4 + 4 gradient values)
    assert_eq!(cpu.len(), 3 * (2 + 512 + 16 + 64 + 4));
    assert!(cpu.iter().all(|v| v.is_finite()));
    let (loss, w2_gradient) = (cpu[1], &cpu[2 + 512 + 16..2 + 512 + 16 + 64]);
    assert!(loss > 0.5 && loss < 5.0, "loss {loss}");
    assert!(
        w2_gradient.iter().any(|g| g.abs() > 1e-3),
        "a zero gradient"
    );
    if no_device() {
        return;
    }
    set_device(&ctx, "gpu").await;
    let gpu = numbers(&ctx, MLP).await.unwrap();
    assert_close("MLP loss and gradients, gpu vs cpu", &gpu, &cpu);
    println!("GPU: {:?}", cuda::device_name());
}
