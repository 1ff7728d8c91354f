-- Valuing training rows, all in SQL: which rows of a training table help a
-- model trained by a loop, and which hurt it.
--
-- A tanh unit with 3 weights is trained by 30 steps of weighted gradient
-- descent over a 200-row table, w ← w − 0.5 · Σ wt·∇loss / Σ wt, every row
-- weighted 1; 8 rows (i = 25, 50, …, 200) have their labels flipped. The
-- validation loss after the loop (100 clean held-out rows) is a function of
-- every row's weight, and `grad((SELECT loss FROM loss), tr.wt)` is its
-- derivative with respect to each: relational reverse mode *through* the
-- loop (the adjoints of the loop's states run backwards by a recursive
-- query, then one aggregate over the data sums each iteration's
-- contribution per row). A positive derivative means that the row, given
-- more weight, would raise the validation loss: the flipped rows come
-- first (tests/training.rs checks the values against finite differences
-- of the same descent in Rust).
--
--   cargo run --features test-build --bin dfgrad -- -f examples/data_valuation.sql

CREATE TABLE samples AS
SELECT value AS i,
       tensor([sin(value * 0.37), cos(value * 0.91), sin(value * 1.3 + 1.0)], 3) AS x
FROM generate_series(1, 300);

CREATE TABLE tr AS
SELECT i, x,
       CASE WHEN i % 25 = 0 THEN -1.0 ELSE 1.0 END * tanh(dot(x, tensor([0.8, -0.5, 0.3], 3))) AS y,
       1.0 AS wt
FROM samples WHERE i <= 200;

CREATE TABLE va AS
SELECT x, tanh(dot(x, tensor([0.8, -0.5, 0.3], 3))) AS y FROM samples WHERE i > 200;

WITH RECURSIVE train(step, w) AS (
  SELECT 0, tensor([0.0, 0.0, 0.0], 3)
  UNION ALL
  SELECT step + 1,
         tensor_sub(w, scale(tensor_sum(scale(grad(power(tanh(dot(w, tr.x)) - tr.y, 2), w), tr.wt)),
                             0.5 / sum(tr.wt)))
  FROM train CROSS JOIN tr WHERE step < 30 GROUP BY step, w),
loss AS (SELECT avg(power(tanh(dot(w, va.x)) - va.y, 2)) AS loss FROM train CROSS JOIN va WHERE step = 30)
SELECT i, grad((SELECT loss FROM loss), tr.wt) AS harm FROM tr ORDER BY harm DESC LIMIT 10;
