-- Softmax (multinomial logistic) regression, 3 classes, by gradient descent in
-- ONE recursive query.
--
-- 3,000 points in [-2, 2]² are generated in SQL; each label is the arg max of
-- three linear class scores plus deterministic noise, so the classes overlap
-- (the optimum is finite). The model has 9 parameters: per class k the logit
-- zk = wk_1·x1 + wk_2·x2 + bk. The loss is the numerically stable negative
-- log-softmax of the true class,
--   m + ln(Σ exp(zk − m)) − z_label,   m = greatest(z0, z1, z2),
-- written once as a derived column; one `grad(avg(nll), ...)` in the recursive
-- term gives all nine partials as a struct. `loss`, `grad_norm` and
-- `accuracy` describe each row's parameters (the next iteration computes
-- them, hence `lead`).
--
--   cargo run --features test-build --bin dfgrad -- -f examples/softmax_regression.sql

CREATE TABLE samples AS
SELECT x1, x2,
       CASE WHEN t0 >= t1 AND t0 >= t2 THEN 0 WHEN t1 >= t2 THEN 1 ELSE 2 END AS label
FROM (SELECT x1, x2,
             x1 + sin(i * 12.9898) AS t0,
             -0.5 * x1 + 0.9 * x2 + sin(i * 78.233) AS t1,
             -0.5 * x1 - 0.9 * x2 + sin(i * 37.719) AS t2
      FROM (SELECT i, 2.0 * sin(i * 1.7 + 0.3) AS x1, 2.0 * cos(i * 2.3 + 0.1) AS x2
            FROM (SELECT CAST(value AS DOUBLE) AS i FROM generate_series(1, 3000))));

WITH RECURSIVE fit(step, w0_1, w0_2, b0, w1_1, w1_2, b1, w2_1, w2_2, b2,
                   loss, grad_norm, accuracy) AS (
  SELECT 0, CAST(0.0 AS DOUBLE) AS w0_1, 0.0 AS w0_2, 0.0 AS b0,
         0.0 AS w1_1, 0.0 AS w1_2, 0.0 AS b1, 0.0 AS w2_1, 0.0 AS w2_2, 0.0 AS b2,
         CAST(NULL AS DOUBLE) AS loss, CAST(NULL AS DOUBLE) AS grad_norm,
         CAST(NULL AS DOUBLE) AS accuracy
  UNION ALL
  SELECT step + 1,
         w0_1 - 3.0 * g['w0_1'], w0_2 - 3.0 * g['w0_2'], b0 - 3.0 * g['b0'],
         w1_1 - 3.0 * g['w1_1'], w1_2 - 3.0 * g['w1_2'], b1 - 3.0 * g['b1'],
         w2_1 - 3.0 * g['w2_1'], w2_2 - 3.0 * g['w2_2'], b2 - 3.0 * g['b2'],
         loss,
         sqrt(g['w0_1'] * g['w0_1'] + g['w0_2'] * g['w0_2'] + g['b0'] * g['b0']
              + g['w1_1'] * g['w1_1'] + g['w1_2'] * g['w1_2'] + g['b1'] * g['b1']
              + g['w2_1'] * g['w2_1'] + g['w2_2'] * g['w2_2'] + g['b2'] * g['b2']),
         accuracy
  FROM (SELECT step, w0_1, w0_2, b0, w1_1, w1_2, b1, w2_1, w2_2, b2,
               avg(nll) AS loss,
               grad(avg(nll), w0_1, w0_2, b0, w1_1, w1_2, b1, w2_1, w2_2, b2) AS g,
               avg(CASE WHEN label = predicted THEN 1.0 ELSE 0.0 END) AS accuracy
        FROM (SELECT step, w0_1, w0_2, b0, w1_1, w1_2, b1, w2_1, w2_2, b2, x1, x2, label,
                     m + ln(exp(z0 - m) + exp(z1 - m) + exp(z2 - m))
                       - CASE label WHEN 0 THEN z0 WHEN 1 THEN z1 ELSE z2 END AS nll,
                     CASE WHEN z0 >= z1 AND z0 >= z2 THEN 0 WHEN z1 >= z2 THEN 1 ELSE 2 END
                       AS predicted
              FROM (SELECT *, greatest(z0, z1, z2) AS m
                    FROM (SELECT step, w0_1, w0_2, b0, w1_1, w1_2, b1, w2_1, w2_2, b2,
                                 x1, x2, label,
                                 w0_1 * x1 + w0_2 * x2 + b0 AS z0,
                                 w1_1 * x1 + w1_2 * x2 + b1 AS z1,
                                 w2_1 * x1 + w2_2 * x2 + b2 AS z2
                          FROM fit CROSS JOIN samples
                          WHERE step <= 300)))
        GROUP BY step, w0_1, w0_2, b0, w1_1, w1_2, b1, w2_1, w2_2, b2)
)
SELECT * FROM (SELECT step, w0_1, w0_2, b0, w1_1, w1_2, b1, w2_1, w2_2, b2,
                      lead(loss) OVER (ORDER BY step) AS loss,
                      lead(grad_norm) OVER (ORDER BY step) AS grad_norm,
                      lead(accuracy) OVER (ORDER BY step) AS accuracy
               FROM fit)
WHERE step % 25 = 0 AND step <= 300
ORDER BY step;
