"""Another major version of the stock datafusion package (issue 21 item 10):
install refuses it with a typed error instead of crashing in its FFI, and
xarray-sql 0.6.0 (which pins datafusion 54.0.0) reaches grad through Arrow
streams.

The xarray-sql tests run in a virtual environment of their own (datafusion 54
cannot share a process's site-packages with the 55 our interop tests use),
made on first use under ~/.cache/datafusion-grad/venvs (XDG_CACHE_HOME is
honoured; DATAFUSION_GRAD_VENVS overrides the folder) and kept between runs;
this package reaches it through PYTHONPATH, pointing at the installed one.
They are skipped only when PyPI cannot be reached.
"""

import fcntl
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

datafusion = pytest.importorskip("datafusion")

import datafusion_grad as dg  # noqa: E402
from datafusion_grad import errors  # noqa: E402

XARRAY_SQL = "xarray-sql==0.6.0"
EXPECTED_MAJOR = dg.DATAFUSION_VERSION.split(".")[0]


def assert_names_both_versions(message, found):
    assert f"datafusion {found} is not supported" in message
    assert f"built against DataFusion {dg.DATAFUSION_VERSION}" in message
    assert f'pip install "datafusion=={EXPECTED_MAJOR}.*"' in message
    assert "register_arrow" in message


# --- the version check, in this process (datafusion 55 pretending) ---------


@pytest.fixture
def no_ffi(monkeypatch):
    """Fails the test if anything would be handed over through the FFI."""

    def crossed(*args, **kwargs):
        pytest.fail("an FFI object was handed to datafusion before the version check")

    monkeypatch.setattr(datafusion, "udf", crossed)
    monkeypatch.setattr(datafusion, "udaf", crossed)
    monkeypatch.setattr(datafusion, "udtf", crossed)
    monkeypatch.setattr(datafusion.SessionContext, "with_extensions", crossed)


@pytest.mark.parametrize("found", ["54.0.0", "56.0.0", "garbage"])
def test_install_refuses_another_major(monkeypatch, no_ffi, found):
    monkeypatch.setattr(datafusion, "__version__", found)
    ctx = datafusion.SessionContext()
    with pytest.raises(errors.IncompatibleDataFusionError) as raised:
        dg.install(ctx)
    err = raised.value
    assert isinstance(err, dg.DataFusionGradError) and not isinstance(err, dg.GradError)
    assert dg.IncompatibleDataFusionError is errors.IncompatibleDataFusionError
    assert (err.found, err.expected) == (found, dg.DATAFUSION_VERSION)
    assert_names_both_versions(str(err), found)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and str(again) == str(err)
    # the session is untouched: no grad was registered
    with pytest.raises(Exception, match="(?i)grad"):
        ctx.sql("SELECT grad(x * x, x) FROM (VALUES (1.0)) AS t(x)").collect()


def test_grad_extension_refuses_another_major(monkeypatch):
    monkeypatch.setattr(datafusion, "__version__", "54.0.0")
    extension = dg.GradExtension()
    ctx = datafusion.SessionContext()
    with pytest.raises(errors.IncompatibleDataFusionError, match="54.0.0"):
        extension.__datafusion_session_components__(ctx)
    with pytest.raises(errors.IncompatibleDataFusionError, match="54.0.0"):
        extension.__datafusion_session_planner__(ctx, None)


def test_same_major_other_minor_installs(monkeypatch):
    monkeypatch.setattr(datafusion, "__version__", f"{EXPECTED_MAJOR}.9.1")
    ctx = dg.install(datafusion.SessionContext())
    got = ctx.sql("SELECT grad(x * x, x) AS d FROM (VALUES (3.0)) AS t(x)").to_pydict()
    assert got == {"d": [6.0]}


def test_the_arrow_path_with_the_stock_package():
    """What the error message proposes, in the versions at hand: their table
    into our session, our result back into theirs."""
    theirs = datafusion.SessionContext()
    theirs.from_pydict({"x": [1.0, 2.0, 3.0]}, name="t")
    ctx = dg.SessionContext()
    ctx.register_arrow("t", theirs.sql("SELECT x FROM t"))
    ours = ctx.sql("SELECT x, grad(x * x * x, x) AS d FROM t ORDER BY x")
    theirs.from_arrow(ours, name="r")
    assert theirs.sql("SELECT sum(d) AS s FROM r").to_pydict() == {"s": [3.0 + 12.0 + 27.0]}


# --- xarray-sql 0.6.0 with datafusion 54.0.0, in a venv of its own ---------

NETWORK_ERRORS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Max retries exceeded",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "No route to host",
    "Connection refused",
)


def venv_dir():
    root = os.environ.get("DATAFUSION_GRAD_VENVS")
    if root is None:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        root = os.path.join(cache, "datafusion-grad", "venvs")
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    return Path(root) / f"{XARRAY_SQL.replace('==', '-')}-{tag}"


def run_logged(cmd, log):
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    log.append(f"$ {' '.join(map(str, cmd))}\n{run.stdout}{run.stderr}")
    return run.returncode == 0


@pytest.fixture(scope="session")
def xarray_sql_python():
    """The Python of a venv with xarray-sql 0.6.0 (and so datafusion 54.0.0),
    made once and reused (a file lock guards concurrent runs)."""
    path = venv_dir()
    python = path / "bin" / "python"
    done = path / ".datafusion-grad-complete"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            log = []
            ok = run_logged([sys.executable, "-m", "venv", str(path)], log) and run_logged(
                [str(python), "-m", "pip", "install", "--quiet", XARRAY_SQL], log
            )
            if not ok:
                shutil.rmtree(path, ignore_errors=True)
                text = "\n".join(log)
                if any(marker in text for marker in NETWORK_ERRORS):
                    last = text.strip().splitlines()[-1]
                    pytest.skip(f"PyPI unreachable, cannot install {XARRAY_SQL} ({last})")
                pytest.fail(f"could not make the {XARRAY_SQL} venv at {path}:\n{text[-4000:]}")
            done.write_text(XARRAY_SQL + "\n")
    return python


@pytest.fixture
def run_in_venv(xarray_sql_python, tmp_path):
    """Runs a script in the venv, with this (installed) datafusion_grad
    reachable through PYTHONPATH and nothing else of this environment."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "datafusion_grad").symlink_to(Path(dg.__file__).resolve().parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(shim), PYTHONNOUSERSITE="1")

    def run(script):
        return subprocess.run(
            [str(xarray_sql_python), "-c", textwrap.dedent(script)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=600,
        )

    return run


PRELUDE = """
import datafusion, numpy as np, xarray as xr, xarray_sql
import datafusion_grad as dg

assert datafusion.__version__ == "54.0.0", datafusion.__version__
assert dg.__file__.startswith({shim!r}), dg.__file__
"""


def test_install_into_xarray_context_raises_not_crashes(run_in_venv, tmp_path):
    run = run_in_venv(
        PRELUDE.format(shim=str(tmp_path / "shim"))
        + """
try:
    dg.install(xarray_sql.XarrayContext())
except dg.errors.IncompatibleDataFusionError as e:
    print("refused:", e)
else:
    raise SystemExit("install() accepted datafusion 54")
"""
    )
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert run.stdout.startswith("refused: ")
    assert_names_both_versions(run.stdout, "54.0.0")


TRAIN = """
rng = np.random.default_rng(7)
time, site = np.arange(8), np.arange(12)
x = rng.uniform(-1.0, 1.0, (time.size, site.size))
y = 2.5 * x + 0.7 + 0.1 * rng.standard_normal(x.shape)
ds = xr.Dataset(
    {"x": (("time", "site"), x), "y": (("time", "site"), y)},
    coords={"time": time, "site": site},
)

# xarray-sql (datafusion 54): the Dataset as a table, queried there.
theirs = xarray_sql.XarrayContext()
theirs.from_dataset("obs", ds, chunks={"time": 3})
points = theirs.sql("SELECT time, site, x, y FROM obs WHERE x IS NOT NULL")

# Into our session through the Arrow stream; gradient descent in one query.
ctx = dg.SessionContext()
ctx.register_arrow("points", points)
assert ctx.sql("SELECT count(*) AS n FROM points").to_pydict() == {"n": [x.size]}
ctx.sql('''
CREATE VIEW fit AS
WITH RECURSIVE descent(step, w, b) AS (
  SELECT 0 AS step, CAST(0.0 AS DOUBLE) AS w, CAST(0.0 AS DOUBLE) AS b
  UNION ALL
  SELECT step + 1,
         w - 0.5 * grad(avg(power(w * x + b - y, 2)), w),
         b - 0.5 * grad(avg(power(w * x + b - y, 2)), b)
  FROM descent CROSS JOIN points
  WHERE step < 400
  GROUP BY step, w, b
)
SELECT w, b FROM descent WHERE step = 400
''').collect()
got = ctx.sql("SELECT w, b FROM fit").to_pylist()[0]
design = np.column_stack([x.ravel(), np.ones(x.size)])
(w, b), *_ = np.linalg.lstsq(design, y.ravel(), rcond=None)
assert abs(got["w"] - w) < 1e-6 and abs(got["b"] - b) < 1e-6, (got, w, b)
assert abs(w - 2.5) < 0.1 and abs(b - 0.7) < 0.1, (w, b)

# The residuals back into xarray-sql, and from there into an xarray Dataset.
residuals = ctx.sql("SELECT time, site, y - (w * x + b) AS r FROM points CROSS JOIN fit")
theirs.from_arrow(residuals, name="residuals")
back = theirs.sql("SELECT time, site, r FROM residuals").to_dataset(dims=["time", "site"])
expected = y - (w * x + b)
r = back["r"].sel(time=time, site=site).values
assert np.allclose(r, expected, atol=1e-5), np.abs(r - expected).max()
print(f"w={got['w']:.6f} b={got['b']:.6f}")
"""


def test_train_over_an_xarray_dataset_through_arrow_streams(run_in_venv, tmp_path):
    run = run_in_venv(PRELUDE.format(shim=str(tmp_path / "shim")) + TRAIN)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert run.stdout.startswith("w=2.")
