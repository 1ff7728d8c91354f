"""Logistic regression trained by gradient descent in ONE SQL query, with
the loss curve plotted to a PNG (needs matplotlib).

    pip install ./python matplotlib
    python python/examples/train_plot.py loss.png

The data (two overlapping Gaussian-ish clouds) is generated in SQL; the
numerically stable log-loss is written once and differentiated by grad()
inside the recursive term, so each step is one pass over the data.
"""

import sys

import datafusion_grad as dg

STEPS = 200

DATA = """
CREATE TABLE points AS
SELECT x1, x2, CASE WHEN x1 + 0.5 * x2 + 0.3 * sin(i * 78.233) > 0.1 THEN 1.0 ELSE 0.0 END AS y
FROM (SELECT value AS i,
             sin(value * 12.9898) * 2.0 AS x1,
             cos(value * 4.1414) * 2.0 AS x2
      FROM generate_series(1, 5000))
"""

# log(1 + exp(-|z|)) + max(z, 0) - y z: the log-loss of a logit z, stable
LOSS = "ln(1 + exp(-abs(w1 * x1 + w2 * x2 + b))) + greatest(w1 * x1 + w2 * x2 + b, 0) - y * (w1 * x1 + w2 * x2 + b)"

TRAIN = f"""
WITH RECURSIVE fit(step, w1, w2, b, loss) AS (
  SELECT 0 AS step, 0.0 AS w1, 0.0 AS w2, 0.0 AS b, CAST(NULL AS DOUBLE) AS loss
  UNION ALL
  SELECT step + 1,
         w1 - 1.0 * grad(avg({LOSS}), w1),
         w2 - 1.0 * grad(avg({LOSS}), w2),
         b  - 1.0 * grad(avg({LOSS}), b),
         avg({LOSS})
  FROM fit CROSS JOIN points
  WHERE step < {STEPS}
  GROUP BY step, w1, w2, b
)
SELECT step, w1, w2, b, loss FROM fit WHERE step > 0 ORDER BY step
"""


def main(out: str) -> None:
    ctx = dg.SessionContext()
    ctx.sql(DATA).collect()
    history = ctx.sql(TRAIN).to_pandas()
    last = history.iloc[-1]
    accuracy = ctx.sql(
        f"SELECT avg(CASE WHEN ({last.w1} * x1 + {last.w2} * x2 + {last.b} > 0) = (y = 1.0) "
        "THEN 1.0 ELSE 0.0 END) AS acc FROM points"
    ).to_pydict()["acc"][0]
    print(f"after {STEPS} steps: w1={last.w1:.4f} w2={last.w2:.4f} b={last.b:.4f} "
          f"loss={last.loss:.5f} accuracy={accuracy:.3f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(history["step"], history["loss"])
    ax.set_xlabel("step")
    ax.set_ylabel("mean log-loss")
    ax.set_title("Logistic regression trained in one SQL query")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"loss curve written to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "loss.png")
