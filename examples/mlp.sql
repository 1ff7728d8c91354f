-- A 784-20-10 multi-layer perceptron trained for 100 steps of full-batch
-- gradient descent in ONE recursive query, on tensor columns.
--
-- Data: 6,000 synthetic MNIST-shaped samples (784 features, 10 classes),
-- generated deterministically in SQL: sample i has class i % 10 and features
--   x[i, j] = sin(0.05 · j · (class + 1)) + 0.8 · noise(i, j),
-- noise a hash of (i, j) uniform in [-1, 1], plus a constant 1 feature (the
-- hidden layer's bias). The samples are stored as 3 batches of 2,000: one row
-- per batch holding a 2000×785 matrix `x` and a vector of 2,000 labels `y`.
--
-- Model: logits = relu(x · w1) · w2, with w1 785×20 and w2 20×10 matrices,
-- loss = cross_entropy(logits, y) (softmax cross-entropy, mean over a batch).
-- Each step averages the batches' gradients with tensor_avg and moves the
-- parameters against them; grad(loss, w1) is a 785×20 tensor computed by
-- reverse mode through matmul, relu and cross_entropy (two GEMMs per layer).
--
--   cargo run --release --bin dfgrad -- -f examples/mlp.sql

CREATE TABLE mnist_like AS
WITH cells AS (
  SELECT i, j,
         CASE WHEN j = 784 THEN 1.0
              ELSE sin(0.05 * j * (i % 10 + 1)) + 0.8 * (2.0 * (h - floor(h)) - 1.0)
         END AS v
  FROM (SELECT i, j, sin(i * 12.9898 + j * 78.233) * 43758.5453 AS h
        FROM (SELECT value AS i FROM generate_series(0, 5999)),
             (SELECT value AS j FROM generate_series(0, 784)))
),
samples AS (
  SELECT i, array_agg(v ORDER BY j) AS x FROM cells GROUP BY i
)
SELECT i / 2000 AS batch,
       tensor(array_agg(x ORDER BY i), 2000, 785) AS x,
       tensor(array_agg(CAST(i % 10 AS DOUBLE) ORDER BY i), 2000) AS y
FROM samples
GROUP BY i / 2000;

CREATE TABLE mlp_init AS
SELECT (SELECT tensor(array_agg(0.08 * sin(value * 12.9898 + 1.0) ORDER BY value), 785, 20)
        FROM generate_series(0, 15699)) AS w1,
       (SELECT tensor(array_agg(0.3 * sin(value * 78.233 + 2.0) ORDER BY value), 20, 10)
        FROM generate_series(0, 199)) AS w2;

WITH RECURSIVE train(step, w1, w2) AS (
  SELECT 0, w1, w2 FROM mlp_init
  UNION ALL
  SELECT step + 1,
         tensor_sub(w1, scale(tensor_avg(grad(cross_entropy(matmul(relu(matmul(x, w1)), w2), y), w1)), 0.5)),
         tensor_sub(w2, scale(tensor_avg(grad(cross_entropy(matmul(relu(matmul(x, w1)), w2), y), w2)), 0.5))
  FROM train CROSS JOIN mnist_like
  WHERE step < 100
  GROUP BY step, w1, w2
)
SELECT step,
       avg(cross_entropy(matmul(relu(matmul(x, w1)), w2), y)) AS loss,
       1.0 - avg(tensor_mean(tensor_step(tensor_mul(
                 tensor_sub(argmax(matmul(relu(matmul(x, w1)), w2)), y),
                 tensor_sub(argmax(matmul(relu(matmul(x, w1)), w2)), y))))) AS accuracy
FROM train CROSS JOIN mnist_like
WHERE step % 10 = 0
GROUP BY step
ORDER BY step;
