-- Linear regression with 10 parameters (9 features and a bias) by gradient
-- descent in ONE recursive query.
--
-- 10,000 rows of 9 correlated features (sines of the row index, each mixed
-- with its neighbour) and a noisy linear target are generated in SQL. The loss
-- (the squared error) is written once, as a derived column; one
-- `grad(avg(loss), b, w1, ..., w9)` in the recursive term gives all ten
-- partials of the mean squared error as a struct (`g['w1']`), so each
-- iteration is one pass over the data. `mse` is the loss at each row's
-- parameters (computed by the next iteration, hence `lead`).
--
--   cargo run --features test-build --bin dfgrad -- -f examples/linear_regression_10.sql

CREATE TABLE points AS
SELECT x1, x2, x3, x4, x5, x6, x7, x8, x9,
       0.5 + 1.5 * x1 - 2.0 * x2 + 0.5 * x3 + 3.0 * x4 - 1.0 * x5
           + 0.25 * x6 + 2.0 * x7 - 0.75 * x8 + 1.0 * x9
           + 0.1 * sin(i * 12.9898) AS y
FROM (SELECT i, s1 AS x1, s2 + 0.4 * s1 AS x2, s3 + 0.4 * s2 AS x3,
             s4 + 0.4 * s3 AS x4, s5 + 0.4 * s4 AS x5, s6 + 0.4 * s5 AS x6,
             s7 + 0.4 * s6 AS x7, s8 + 0.4 * s7 AS x8, s9 + 0.4 * s8 AS x9
      FROM (SELECT i,
                   sin(i * 0.48 + 1.0) AS s1, sin(i * 0.85 + 2.0) AS s2,
                   sin(i * 1.22 + 3.0) AS s3, sin(i * 1.59 + 4.0) AS s4,
                   sin(i * 1.96 + 5.0) AS s5, sin(i * 2.33 + 6.0) AS s6,
                   sin(i * 2.70 + 7.0) AS s7, sin(i * 3.07 + 8.0) AS s8,
                   sin(i * 3.44 + 9.0) AS s9
            FROM (SELECT CAST(value AS DOUBLE) AS i FROM generate_series(1, 10000))));

WITH RECURSIVE fit(step, b, w1, w2, w3, w4, w5, w6, w7, w8, w9, mse) AS (
  SELECT 0, CAST(0.0 AS DOUBLE) AS b, 0.0 AS w1, 0.0 AS w2, 0.0 AS w3, 0.0 AS w4,
         0.0 AS w5, 0.0 AS w6, 0.0 AS w7, 0.0 AS w8, 0.0 AS w9, CAST(NULL AS DOUBLE) AS mse
  UNION ALL
  SELECT step + 1,
         b - 0.8 * g['b'], w1 - 0.8 * g['w1'], w2 - 0.8 * g['w2'], w3 - 0.8 * g['w3'],
         w4 - 0.8 * g['w4'], w5 - 0.8 * g['w5'], w6 - 0.8 * g['w6'], w7 - 0.8 * g['w7'],
         w8 - 0.8 * g['w8'], w9 - 0.8 * g['w9'],
         mse
  FROM (SELECT step, b, w1, w2, w3, w4, w5, w6, w7, w8, w9,
               avg(loss) AS mse,
               grad(avg(loss), b, w1, w2, w3, w4, w5, w6, w7, w8, w9) AS g
        FROM (SELECT step, b, w1, w2, w3, w4, w5, w6, w7, w8, w9,
                     x1, x2, x3, x4, x5, x6, x7, x8, x9, y,
                     power(b + w1 * x1 + w2 * x2 + w3 * x3 + w4 * x4 + w5 * x5
                             + w6 * x6 + w7 * x7 + w8 * x8 + w9 * x9 - y, 2) AS loss
              FROM fit CROSS JOIN points
              WHERE step <= 100)
        GROUP BY step, b, w1, w2, w3, w4, w5, w6, w7, w8, w9)
)
SELECT * FROM (SELECT step, b, w1, w2, w3, w4, w5, w6, w7, w8, w9,
                      lead(mse) OVER (ORDER BY step) AS mse
               FROM fit)
WHERE step % 10 = 0 AND step <= 100
ORDER BY step;
