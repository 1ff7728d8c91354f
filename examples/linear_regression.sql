-- Linear regression by gradient descent: the whole training loop is ONE query.
--
-- 10,000 points on y = 3x - 2 plus deterministic noise are generated in SQL;
-- the loss (the mean squared error) is written once and `grad` differentiates
-- it through the aggregate inside the recursive term of the CTE, so each
-- iteration is one pass over the data.
--
--   cargo run --features test-build --bin dfgrad -- -f examples/linear_regression.sql

CREATE TABLE points AS
SELECT x, 3.0 * x - 2.0 + 0.1 * sin(i * 12.9898) AS y
FROM (SELECT value AS i, CAST(value % 200 AS DOUBLE) / 100.0 - 1.0 AS x
      FROM generate_series(1, 10000));

WITH RECURSIVE fit(step, w, b) AS (
  SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b
  UNION ALL
  SELECT step + 1,
         w - 0.5 * grad(avg(power(w * x + b - y, 2)), w),
         b - 0.5 * grad(avg(power(w * x + b - y, 2)), b)
  FROM fit CROSS JOIN points
  WHERE step < 200
  GROUP BY step, w, b
)
SELECT step, w, b, avg(power(w * x + b - y, 2)) AS mse
FROM fit CROSS JOIN points
WHERE step % 25 = 0
GROUP BY step, w, b
ORDER BY step;
