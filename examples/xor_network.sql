-- A 2-4-1 neural network learns XOR, trained by gradient descent in ONE
-- recursive query.
--
-- 500 points in [-1, 1]² are generated in SQL, labelled 1 where x1·x2 > 0 (the
-- XOR of the signs). The network has a tanh hidden layer of 4 units,
--   hj = tanh(wj_1·x1 + wj_2·x2 + bj),
-- and a logistic output on the logit o = u1·h1 + … + u4·h4 + c: 17 parameters,
-- started from fixed values (sines and cosines of the unit index). Hidden
-- activations, logit and loss (the numerically stable log-loss
--   max(o, 0) − o·label + ln(1 + exp(−|o|))) are derived columns, written once;
-- one `grad(avg(nll), ...)` in the recursive term differentiates through all of
-- them and gives the 17 partials as a struct. `loss` and `accuracy` describe
-- each row's parameters (the next iteration computes them, hence `lead`).
--
--   cargo run --features test-build --bin dfgrad -- -f examples/xor_network.sql

CREATE TABLE xor_points AS
SELECT x1, x2, CASE WHEN x1 * x2 > 0 THEN 1.0 ELSE 0.0 END AS label
FROM (SELECT sin(i * 1.7 + 0.3) AS x1, cos(i * 2.3 + 0.1) AS x2
      FROM (SELECT CAST(value AS DOUBLE) AS i FROM generate_series(1, 500)));

WITH RECURSIVE fit(step, w1_1, w1_2, b1, w2_1, w2_2, b2, w3_1, w3_2, b3, w4_1, w4_2, b4,
                   u1, u2, u3, u4, c, loss, accuracy) AS (
  SELECT 0,
         sin(1.3) AS w1_1, cos(2.1) AS w1_2, 0.0 AS b1,
         sin(2.6) AS w2_1, cos(4.2) AS w2_2, 0.0 AS b2,
         sin(3.9) AS w3_1, cos(6.3) AS w3_2, 0.0 AS b3,
         sin(5.2) AS w4_1, cos(8.4) AS w4_2, 0.0 AS b4,
         0.5 * sin(3.7) AS u1, 0.5 * sin(7.4) AS u2, 0.5 * sin(11.1) AS u3,
         0.5 * sin(14.8) AS u4, 0.0 AS c,
         CAST(NULL AS DOUBLE) AS loss, CAST(NULL AS DOUBLE) AS accuracy
  UNION ALL
  SELECT step + 1,
         w1_1 - 2.0 * g['w1_1'], w1_2 - 2.0 * g['w1_2'], b1 - 2.0 * g['b1'],
         w2_1 - 2.0 * g['w2_1'], w2_2 - 2.0 * g['w2_2'], b2 - 2.0 * g['b2'],
         w3_1 - 2.0 * g['w3_1'], w3_2 - 2.0 * g['w3_2'], b3 - 2.0 * g['b3'],
         w4_1 - 2.0 * g['w4_1'], w4_2 - 2.0 * g['w4_2'], b4 - 2.0 * g['b4'],
         u1 - 2.0 * g['u1'], u2 - 2.0 * g['u2'], u3 - 2.0 * g['u3'], u4 - 2.0 * g['u4'],
         c - 2.0 * g['c'],
         loss, accuracy
  FROM (SELECT step, w1_1, w1_2, b1, w2_1, w2_2, b2, w3_1, w3_2, b3, w4_1, w4_2, b4,
               u1, u2, u3, u4, c,
               avg(nll) AS loss,
               grad(avg(nll), w1_1, w1_2, b1, w2_1, w2_2, b2, w3_1, w3_2, b3,
                    w4_1, w4_2, b4, u1, u2, u3, u4, c) AS g,
               avg(CASE WHEN (o > 0) = (label > 0) THEN 1.0 ELSE 0.0 END) AS accuracy
        FROM (SELECT *, greatest(o, 0.0) - o * label + ln(1.0 + exp(-abs(o))) AS nll
              FROM (SELECT *, u1 * h1 + u2 * h2 + u3 * h3 + u4 * h4 + c AS o
                    FROM (SELECT step, w1_1, w1_2, b1, w2_1, w2_2, b2, w3_1, w3_2, b3,
                                 w4_1, w4_2, b4, u1, u2, u3, u4, c, x1, x2, label,
                                 tanh(w1_1 * x1 + w1_2 * x2 + b1) AS h1,
                                 tanh(w2_1 * x1 + w2_2 * x2 + b2) AS h2,
                                 tanh(w3_1 * x1 + w3_2 * x2 + b3) AS h3,
                                 tanh(w4_1 * x1 + w4_2 * x2 + b4) AS h4
                          FROM fit CROSS JOIN xor_points
                          WHERE step <= 500)))
        GROUP BY step, w1_1, w1_2, b1, w2_1, w2_2, b2, w3_1, w3_2, b3, w4_1, w4_2, b4,
                 u1, u2, u3, u4, c)
)
SELECT * FROM (SELECT step, w1_1, w1_2, b1, w2_1, w2_2, b2, w3_1, w3_2, b3,
                      w4_1, w4_2, b4, u1, u2, u3, u4, c,
                      lead(loss) OVER (ORDER BY step) AS loss,
                      lead(accuracy) OVER (ORDER BY step) AS accuracy
               FROM fit)
WHERE step % 50 = 0 AND step <= 500
ORDER BY step;
