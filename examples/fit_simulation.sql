-- Fitting a simulation's parameters to observations, all in SQL, with
-- derivatives *through* a recursive query.
--
-- The logistic growth x' = a·x·(1 − x), by 60 Euler steps of 0.1, is one
-- WITH RECURSIVE query. Observations of x every 5 steps (generated here
-- from a = 1.8, x0 = 0.05, with a little deterministic noise) are fitted
-- by Gauss–Newton from a = 1.0, x0 = 0.2: each step needs the sensitivity
-- of every simulated x to the growth rate a and to the initial state x0,
-- grad(s.x, s.a) and grad(s.x, s.x0), which are derivatives through all the
-- iterations before it (forward mode: tangent columns carried through the
-- recursion). Each statement below is one Gauss–Newton step on the 2×2
-- normal equations; six reach the least-squares fit.
--
--   cargo run --features test-build --bin dfgrad -- -f examples/fit_simulation.sql

CREATE TABLE observed AS
WITH RECURSIVE truth(step, x) AS (
  SELECT 0 AS step, CAST(0.05 AS DOUBLE) AS x
  UNION ALL
  SELECT step + 1, x + 0.1 * 1.8 * x * (1 - x) FROM truth WHERE step < 60)
SELECT step, x + 0.004 * sin(step * 12.9898) AS x FROM truth WHERE step % 5 = 0;

CREATE TABLE params AS SELECT CAST(1.0 AS DOUBLE) AS a, CAST(0.2 AS DOUBLE) AS x0;

CREATE OR REPLACE TABLE params AS
WITH RECURSIVE sim(step, x, a, x0) AS (
  SELECT 0 AS step, x0 AS x, a, x0 FROM params
  UNION ALL
  SELECT step + 1, x + 0.1 * a * x * (1 - x), a, x0 FROM sim WHERE step < 60),
fit AS (
  SELECT s.x - o.x AS r, grad(s.x, s.a) AS ja, grad(s.x, s.x0) AS jx, s.a, s.x0
  FROM sim s JOIN observed o ON o.step = s.step),
normal AS (
  SELECT a, x0, sum(ja * ja) AS saa, sum(ja * jx) AS sax, sum(jx * jx) AS sxx,
         sum(ja * r) AS sar, sum(jx * r) AS sxr
  FROM fit GROUP BY a, x0)
SELECT a - (sxx * sar - sax * sxr) / (saa * sxx - sax * sax) AS a,
       x0 - (saa * sxr - sax * sar) / (saa * sxx - sax * sax) AS x0
FROM normal;

CREATE OR REPLACE TABLE params AS
WITH RECURSIVE sim(step, x, a, x0) AS (
  SELECT 0 AS step, x0 AS x, a, x0 FROM params
  UNION ALL
  SELECT step + 1, x + 0.1 * a * x * (1 - x), a, x0 FROM sim WHERE step < 60),
fit AS (
  SELECT s.x - o.x AS r, grad(s.x, s.a) AS ja, grad(s.x, s.x0) AS jx, s.a, s.x0
  FROM sim s JOIN observed o ON o.step = s.step),
normal AS (
  SELECT a, x0, sum(ja * ja) AS saa, sum(ja * jx) AS sax, sum(jx * jx) AS sxx,
         sum(ja * r) AS sar, sum(jx * r) AS sxr
  FROM fit GROUP BY a, x0)
SELECT a - (sxx * sar - sax * sxr) / (saa * sxx - sax * sax) AS a,
       x0 - (saa * sxr - sax * sar) / (saa * sxx - sax * sax) AS x0
FROM normal;

CREATE OR REPLACE TABLE params AS
WITH RECURSIVE sim(step, x, a, x0) AS (
  SELECT 0 AS step, x0 AS x, a, x0 FROM params
  UNION ALL
  SELECT step + 1, x + 0.1 * a * x * (1 - x), a, x0 FROM sim WHERE step < 60),
fit AS (
  SELECT s.x - o.x AS r, grad(s.x, s.a) AS ja, grad(s.x, s.x0) AS jx, s.a, s.x0
  FROM sim s JOIN observed o ON o.step = s.step),
normal AS (
  SELECT a, x0, sum(ja * ja) AS saa, sum(ja * jx) AS sax, sum(jx * jx) AS sxx,
         sum(ja * r) AS sar, sum(jx * r) AS sxr
  FROM fit GROUP BY a, x0)
SELECT a - (sxx * sar - sax * sxr) / (saa * sxx - sax * sax) AS a,
       x0 - (saa * sxr - sax * sar) / (saa * sxx - sax * sax) AS x0
FROM normal;

CREATE OR REPLACE TABLE params AS
WITH RECURSIVE sim(step, x, a, x0) AS (
  SELECT 0 AS step, x0 AS x, a, x0 FROM params
  UNION ALL
  SELECT step + 1, x + 0.1 * a * x * (1 - x), a, x0 FROM sim WHERE step < 60),
fit AS (
  SELECT s.x - o.x AS r, grad(s.x, s.a) AS ja, grad(s.x, s.x0) AS jx, s.a, s.x0
  FROM sim s JOIN observed o ON o.step = s.step),
normal AS (
  SELECT a, x0, sum(ja * ja) AS saa, sum(ja * jx) AS sax, sum(jx * jx) AS sxx,
         sum(ja * r) AS sar, sum(jx * r) AS sxr
  FROM fit GROUP BY a, x0)
SELECT a - (sxx * sar - sax * sxr) / (saa * sxx - sax * sax) AS a,
       x0 - (saa * sxr - sax * sar) / (saa * sxx - sax * sax) AS x0
FROM normal;

CREATE OR REPLACE TABLE params AS
WITH RECURSIVE sim(step, x, a, x0) AS (
  SELECT 0 AS step, x0 AS x, a, x0 FROM params
  UNION ALL
  SELECT step + 1, x + 0.1 * a * x * (1 - x), a, x0 FROM sim WHERE step < 60),
fit AS (
  SELECT s.x - o.x AS r, grad(s.x, s.a) AS ja, grad(s.x, s.x0) AS jx, s.a, s.x0
  FROM sim s JOIN observed o ON o.step = s.step),
normal AS (
  SELECT a, x0, sum(ja * ja) AS saa, sum(ja * jx) AS sax, sum(jx * jx) AS sxx,
         sum(ja * r) AS sar, sum(jx * r) AS sxr
  FROM fit GROUP BY a, x0)
SELECT a - (sxx * sar - sax * sxr) / (saa * sxx - sax * sax) AS a,
       x0 - (saa * sxr - sax * sar) / (saa * sxx - sax * sax) AS x0
FROM normal;

CREATE OR REPLACE TABLE params AS
WITH RECURSIVE sim(step, x, a, x0) AS (
  SELECT 0 AS step, x0 AS x, a, x0 FROM params
  UNION ALL
  SELECT step + 1, x + 0.1 * a * x * (1 - x), a, x0 FROM sim WHERE step < 60),
fit AS (
  SELECT s.x - o.x AS r, grad(s.x, s.a) AS ja, grad(s.x, s.x0) AS jx, s.a, s.x0
  FROM sim s JOIN observed o ON o.step = s.step),
normal AS (
  SELECT a, x0, sum(ja * ja) AS saa, sum(ja * jx) AS sax, sum(jx * jx) AS sxx,
         sum(ja * r) AS sar, sum(jx * r) AS sxr
  FROM fit GROUP BY a, x0)
SELECT a - (sxx * sar - sax * sxr) / (saa * sxx - sax * sax) AS a,
       x0 - (saa * sxr - sax * sar) / (saa * sxx - sax * sax) AS x0
FROM normal;

-- the fitted parameters, and the fit's root-mean-square error
WITH RECURSIVE sim(step, x, a, x0) AS (
  SELECT 0 AS step, x0 AS x, a, x0 FROM params
  UNION ALL
  SELECT step + 1, x + 0.1 * a * x * (1 - x), a, x0 FROM sim WHERE step < 60)
SELECT s.a, s.x0, sqrt(avg(power(s.x - o.x, 2))) AS rmse
FROM sim s JOIN observed o ON o.step = s.step GROUP BY s.a, s.x0;
