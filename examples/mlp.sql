-- A 784-20-10 multi-layer perceptron trained for 100 steps of full-batch
-- gradient descent in ONE recursive query, on tensor columns.
--
-- Data: 6,000 synthetic MNIST-shaped training samples (784 features, 10
-- classes) and 2,000 held-out ones, generated deterministically: sample i has
-- class i % 10 and features
--   x[i, :] = prototype[class] + 4 · noise,
-- prototype[k, j] = sin(0.05 · j · (k + 1)), noise uniform in [-1, 1) from
-- random_tensor (a pure function of its seed). The samples are stored in
-- batches of 2,000 (0-2 for training, 3 held out): one row per batch holding
-- a 2000×784 matrix `x` and a vector of 2,000 labels `y`.
--
-- Model: logits = relu(x · w1 + b1) · w2 + b2, w1 784×20, b1 20, w2 20×10,
-- b2 10 (a bias vector is added to every row of a matrix);
-- loss = cross_entropy(logits, y), softmax cross-entropy averaged over a
-- batch. One grad(loss, w1, b1, w2, b2) gives all four gradients (tensors of
-- the parameters' shapes) in one reverse sweep through matmul, relu and
-- cross_entropy; each step averages the batches' gradients with tensor_avg
-- and moves the parameters against them (learning rate 0.5).
-- The result shows the training loss and the held-out accuracy every 10 steps.
--
--   cargo run --features test-build --bin dfgrad -- -f examples/mlp.sql

CREATE TABLE mnist_like AS
WITH prototypes AS (
  SELECT tensor(array_agg(sin(0.05 * j * (k + 1)) ORDER BY k, j), 10, 784) AS p
  FROM (SELECT value AS k FROM generate_series(0, 9)),
       (SELECT value AS j FROM generate_series(0, 783))
),
labels AS (
  SELECT i / 2000 AS batch,
         tensor(array_agg(CAST(i % 10 AS DOUBLE) ORDER BY i), 2000) AS y
  FROM (SELECT value AS i FROM generate_series(0, 7999))
  GROUP BY i / 2000
)
SELECT batch,
       tensor_add(matmul(one_hot(y, 10), p), scale(random_tensor(batch, 2000, 784), 4.0)) AS x,
       y
FROM labels CROSS JOIN prototypes;

WITH RECURSIVE train(step, w1, b1, w2, b2) AS (
  SELECT 0, scale(random_tensor(1, 784, 20), 0.1), zeros_like(random_tensor(3, 20)),
            scale(random_tensor(2, 20, 10), 0.5), zeros_like(random_tensor(4, 10))
  UNION ALL
  SELECT step + 1,
         tensor_sub(w1, scale(tensor_avg(g['w1']), 0.5)),
         tensor_sub(b1, scale(tensor_avg(g['b1']), 0.5)),
         tensor_sub(w2, scale(tensor_avg(g['w2']), 0.5)),
         tensor_sub(b2, scale(tensor_avg(g['b2']), 0.5))
  FROM (SELECT step, w1, b1, w2, b2,
               grad(cross_entropy(tensor_add(matmul(relu(tensor_add(matmul(x, w1), b1)), w2), b2), y),
                    w1, b1, w2, b2) AS g
        FROM train CROSS JOIN mnist_like
        WHERE step < 100 AND batch < 3)
  GROUP BY step, w1, b1, w2, b2
),
scored AS (
  SELECT step, batch, y,
         tensor_add(matmul(relu(tensor_add(matmul(x, w1), b1)), w2), b2) AS logits
  FROM train CROSS JOIN mnist_like
  WHERE step % 10 = 0
)
SELECT step,
       avg(cross_entropy(logits, y)) FILTER (WHERE batch < 3) AS loss,
       avg(1.0 - tensor_mean(tensor_step(tensor_mul(tensor_sub(argmax(logits), y),
                                                    tensor_sub(argmax(logits), y)))))
         FILTER (WHERE batch = 3) AS test_accuracy
FROM scored
GROUP BY step
ORDER BY step;
