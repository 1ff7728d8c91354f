-- Learning per-parameter learning rates, all in SQL: gradient descent on
-- the learning rates themselves, through a whole training loop.
--
-- A tanh unit with 24 weights is trained by 15 steps of gradient descent
-- over a 400-row table, w ← w − lr ⊙ avg(∇ loss), from fixed initial
-- weights; `lr` is a tensor of w's shape (one rate per weight), carried
-- unchanged through the loop. The validation loss after the loop (200
-- held-out rows) is a function of `lr`, and its gradient with respect to
-- all 24 rates goes *through* the 15 aggregating steps: reverse mode
-- (chosen automatically beyond 16 elements), a backward recursive query
-- whose steps are Hessian-vector products over the training rows. Each
-- CREATE OR REPLACE below is one step of descent on the rates (in log
-- space, so that they stay positive); the result shows the validation
-- loss for the rates before and after each: 0.0845, 0.0756, 0.0697
-- (tests/training.rs checks them against the same descent in Rust, its
-- hypergradients by finite differences).
--
--   cargo run --features test-build --bin dfgrad -- -f examples/learning_rates.sql

CREATE TABLE samples AS
SELECT value AS i,
       tensor(array_agg(sin(value * (k + 1) * 0.37 + k) ORDER BY k), 24) AS x
FROM generate_series(1, 600), (SELECT value AS k FROM generate_series(0, 23))
GROUP BY value;

CREATE TABLE truth AS
SELECT tensor(array_agg(0.3 * cos(value * 1.7) ORDER BY value), 24) AS w FROM generate_series(0, 23);

CREATE TABLE tr AS SELECT x, tanh(dot(x, w)) AS y FROM samples, truth WHERE i <= 400;
CREATE TABLE va AS SELECT x, tanh(dot(x, w)) AS y FROM samples, truth WHERE i > 400;

-- log learning rates: every weight starts at rate 0.1
CREATE TABLE rates AS SELECT scale(fill_like(w, 1.0), ln(0.1)) AS log_lr FROM truth;
CREATE TABLE history (hyper_step INT, validation_loss DOUBLE);

-- one hyper-step: the validation loss after training with exp(log_lr), and
-- log_lr moved against its gradient (rate 20)
CREATE OR REPLACE TABLE step_result AS
WITH RECURSIVE train(step, w, log_lr) AS (
  SELECT 0, zeros_like(truth.w), log_lr FROM rates, truth
  UNION ALL
  SELECT step + 1, tensor_sub(w, tensor_mul(tensor_exp(log_lr), tensor_avg(grad(power(tanh(dot(w, x)) - y, 2), w)))), log_lr
  FROM train CROSS JOIN tr WHERE step < 15 GROUP BY step, w, log_lr)
SELECT avg(power(tanh(dot(w, va.x)) - va.y, 2)) AS loss,
       tensor_sub(log_lr, scale(grad(avg(power(tanh(dot(w, va.x)) - va.y, 2)), log_lr), 20.0)) AS log_lr
FROM train CROSS JOIN va WHERE step = 15 GROUP BY log_lr;
INSERT INTO history SELECT 0, loss FROM step_result;
CREATE OR REPLACE TABLE rates AS SELECT log_lr FROM step_result;

CREATE OR REPLACE TABLE step_result AS
WITH RECURSIVE train(step, w, log_lr) AS (
  SELECT 0, zeros_like(truth.w), log_lr FROM rates, truth
  UNION ALL
  SELECT step + 1, tensor_sub(w, tensor_mul(tensor_exp(log_lr), tensor_avg(grad(power(tanh(dot(w, x)) - y, 2), w)))), log_lr
  FROM train CROSS JOIN tr WHERE step < 15 GROUP BY step, w, log_lr)
SELECT avg(power(tanh(dot(w, va.x)) - va.y, 2)) AS loss,
       tensor_sub(log_lr, scale(grad(avg(power(tanh(dot(w, va.x)) - va.y, 2)), log_lr), 20.0)) AS log_lr
FROM train CROSS JOIN va WHERE step = 15 GROUP BY log_lr;
INSERT INTO history SELECT 1, loss FROM step_result;
CREATE OR REPLACE TABLE rates AS SELECT log_lr FROM step_result;

CREATE OR REPLACE TABLE step_result AS
WITH RECURSIVE train(step, w, log_lr) AS (
  SELECT 0, zeros_like(truth.w), log_lr FROM rates, truth
  UNION ALL
  SELECT step + 1, tensor_sub(w, tensor_mul(tensor_exp(log_lr), tensor_avg(grad(power(tanh(dot(w, x)) - y, 2), w)))), log_lr
  FROM train CROSS JOIN tr WHERE step < 15 GROUP BY step, w, log_lr)
SELECT avg(power(tanh(dot(w, va.x)) - va.y, 2)) AS loss,
       tensor_sub(log_lr, scale(grad(avg(power(tanh(dot(w, va.x)) - va.y, 2)), log_lr), 20.0)) AS log_lr
FROM train CROSS JOIN va WHERE step = 15 GROUP BY log_lr;
INSERT INTO history SELECT 2, loss FROM step_result;

SELECT hyper_step, validation_loss FROM history ORDER BY hyper_step;
