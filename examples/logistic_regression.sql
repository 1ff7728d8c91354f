-- Logistic regression by gradient descent in ONE recursive query.
--
-- 2,000 points with a noisy (not separable) label are generated in SQL. The
-- loss is the numerically stable log-loss of the logit z = w·x + b,
--   max(z, 0) − z·label + ln(1 + exp(−|z|)),
-- averaged over the points; `grad` differentiates through the average.
--
--   cargo run --features test-build --bin dfgrad -- -f examples/logistic_regression.sql

CREATE TABLE samples AS
SELECT x, CASE WHEN 2.0 * x - 0.5 + sin(i * 12.9898) > 0 THEN 1.0 ELSE 0.0 END AS label
FROM (SELECT value AS i, CAST(value % 200 AS DOUBLE) / 100.0 - 1.0 AS x
      FROM generate_series(1, 2000));

WITH RECURSIVE fit(step, w, b) AS (
  SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b
  UNION ALL
  SELECT step + 1,
         w - 4.0 * grad(avg(greatest(w * x + b, 0.0) - (w * x + b) * label
                            + ln(1.0 + exp(-abs(w * x + b)))), w),
         b - 4.0 * grad(avg(greatest(w * x + b, 0.0) - (w * x + b) * label
                            + ln(1.0 + exp(-abs(w * x + b)))), b)
  FROM fit CROSS JOIN samples
  WHERE step < 600
  GROUP BY step, w, b
)
SELECT step, w, b,
       avg(greatest(w * x + b, 0.0) - (w * x + b) * label + ln(1.0 + exp(-abs(w * x + b)))) AS loss
FROM fit CROSS JOIN samples
WHERE step % 100 = 0
GROUP BY step, w, b
ORDER BY step;
