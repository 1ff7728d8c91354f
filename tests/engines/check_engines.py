#!/usr/bin/env python3
"""Checks that SQL exported by `dfgrad --rewrite DIALECT` runs on real engines
(DuckDB, PostgreSQL, SQLite, and DataFusion itself) and gives the results
dfgrad computes from the original statement.

Usage: check_engines.py [DFGRAD] [--only REGEX] [--dialect D ...] [--full]

DFGRAD defaults to $DFGRAD, then
${CARGO_TARGET_DIR:-$HOME/.cache/datafusion-grad/target}/debug/dfgrad.

For every case of corpus.sql and every dialect (datafusion, duckdb, postgres,
sqlite), the case's statements are run in dfgrad (the reference), exported
with `dfgrad --rewrite DIALECT`, and the exported statements are run in the
engine (a fresh in-memory DuckDB/SQLite database, a rolled-back transaction
in a throwaway PostgreSQL cluster, a fresh dfgrad process). The rows of the
last statement must agree cell by cell: numbers to 1e-9 relative (1e-12
absolute near 0), NaN = NaN, inf = inf, NULL = NULL, other values exactly.
A case marked `-- refuse: DIALECT, ...` must instead make `dfgrad --rewrite`
exit non-zero with `[unexportable]` on stderr.

Prints one line per failure, then `N passed, M failed`; exits 1 if any
check failed. An engine that cannot be imported or started fails all of its
checks; nothing is skipped.
"""

import argparse
import atexit
import csv
import io
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIALECTS = ["datafusion", "duckdb", "postgres", "sqlite"]
REL_TOL = 1e-9
ABS_TOL = 1e-12
DFGRAD_TIMEOUT = 300
ENGINE_TIMEOUT = 60
MAX_SQL_IN_REPORT = 3000

# --------------------------------------------------------------------------
# Test data: small deterministic tables. Floats are written with a decimal
# point so that DataFusion's CSV inference reads them as Float64, dates as
# YYYY-MM-DD (read as Date32); None is NULL. Text cells are written as they
# are, so they hold no commas, quotes or line breaks.
# --------------------------------------------------------------------------

F, I, T, D = "float", "int", "text", "date"

TABLES = {
    "t": (
        [("id", I), ("x", F), ("y", F), ("z", F)],
        [
            (1, 0.15, -1.3, 1.25),
            (2, 0.35, 2.1, 1.8),
            (3, 0.55, 0.6, 2.5),
            (4, 0.7, -0.45, 3.1),
            (5, 0.85, 1.75, 4.6),
            (6, 0.95, 3.2, 7.3),
        ],
    ),
    "tn": (
        [("id", I), ("x", F), ("y", F)],
        [
            (1, 0.2, 1.5),
            (2, None, 2.0),
            (3, 0.6, None),
            (4, None, None),
            (5, 1.1, -0.7),
            (6, 0.45, 0.3),
        ],
    ),
    "g": (
        [("id", I), ("w", F), ("b", F), ("x", F), ("y", F)],
        [
            (1, 0.5, 0.1, 0.3, 0.5),
            (2, 0.5, 0.1, 1.1, 0.9),
            (3, 0.5, 0.1, -0.4, -0.2),
            (4, 0.5, 0.1, 2.2, 1.4),
            (5, 0.5, -0.3, 0.7, 0.1),
            (6, 0.5, -0.3, -1.2, -0.9),
            (7, 0.5, -0.3, 1.6, 0.6),
            (8, 0.5, -0.3, 0.05, -0.35),
            (9, 1.5, 0.1, 0.2, 0.45),
            (10, 1.5, 0.1, 0.9, 1.6),
            (11, 1.5, 0.1, -0.6, -0.7),
            (12, 1.5, 0.1, 1.3, 2.2),
            (13, 2.0, 0.25, 0.4, 1.1),
            (14, 2.0, 0.25, -0.8, -1.4),
            (15, 2.0, 0.25, 1.7, None),
            (16, 2.0, 0.25, 0.95, 2.3),
        ],
    ),
    "pts": (
        [("x", F), ("y", F)],
        [(0.0, 1.0), (1.0, 3.0), (2.0, 5.0), (3.0, 7.0), (4.0, 9.0)],
    ),
    "words": (
        [("id", I), ("x", F), ("s", T), ("d", D)],
        [
            (1, 0.25, "ab", "2024-01-15"),
            (2, 0.5, "héllo", "2023-06-30"),
            (3, 0.75, "xxpaddedxx", "2020-02-29"),
            (4, 1.25, "a_b%c", "1999-12-31"),
            (5, 1.5, None, None),
            (6, 2.0, "Straße", "2024-03-10"),
        ],
    ),
}

ENGINE_TYPES = {
    "duckdb": {I: "BIGINT", F: "DOUBLE", T: "VARCHAR", D: "DATE"},
    "postgres": {I: "BIGINT", F: "DOUBLE PRECISION", T: "TEXT", D: "DATE"},
    "sqlite": {I: "INTEGER", F: "REAL", T: "TEXT", D: "TEXT"},
}


def write_tables(directory):
    """Writes each table as NAME.csv; returns {name: path}."""
    paths = {}
    for name, (columns, rows) in TABLES.items():
        path = Path(directory) / f"{name}.csv"
        with open(path, "w", newline="") as f:
            f.write(",".join(c for c, _ in columns) + "\n")
            for row in rows:
                cells = []
                for (_, kind), v in zip(columns, row):
                    if v is None:
                        cells.append("")
                    elif kind == F:
                        cells.append(repr(float(v)))
                    elif kind == I:
                        cells.append(str(int(v)))
                    else:
                        cells.append(v)
                f.write(",".join(cells) + "\n")
        paths[name] = path
    return paths


def create_table_sql(name, engine):
    columns, _ = TABLES[name]
    types = ENGINE_TYPES[engine]
    return f"CREATE TABLE {name} ({', '.join(f'{c} {types[k]}' for c, k in columns)})"


# --------------------------------------------------------------------------
# The corpus
# --------------------------------------------------------------------------


class Case:
    def __init__(self, index, name):
        self.index = index
        self.name = name
        self.refuse = set()
        self.lines = []
        self.statements = []


def split_statements(text):
    """Splits at `;` outside quotes and comments; drops empty statements."""
    out, cur, i, n = [], [], 0, len(text)
    quote = None
    while i < n:
        c = text[i]
        if quote:
            cur.append(c)
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c == ";":
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur).strip())
    return [s for s in out if s]


def parse_corpus(path):
    cases = []
    for line in Path(path).read_text().splitlines():
        m = re.match(r"^--\s*name:\s*(\S+)\s*$", line)
        if m:
            cases.append(Case(len(cases), m.group(1)))
            continue
        m = re.match(r"^--\s*refuse:\s*(.*)$", line)
        if m:
            if not cases:
                sys.exit(f"corpus: `-- refuse:` before any `-- name:`")
            for d in re.split(r"[,\s]+", m.group(1).strip()):
                if d not in DIALECTS:
                    sys.exit(f"corpus: case {cases[-1].name}: unknown dialect `{d}`")
                cases[-1].refuse.add(d)
            continue
        if cases:
            cases[-1].lines.append(line)
    names = set()
    for case in cases:
        if case.name in names:
            sys.exit(f"corpus: duplicate case name {case.name}")
        names.add(case.name)
        case.statements = split_statements("\n".join(case.lines))
        if not case.statements:
            sys.exit(f"corpus: case {case.name} has no statement")
    return cases


# --------------------------------------------------------------------------
# Values and comparison
# --------------------------------------------------------------------------


def parse_text_cell(s, true="true", false="false"):
    """A CSV cell (dfgrad or psql) as a Python value; '' is NULL."""
    if s == "":
        return None
    if s == true:
        return True
    if s == false:
        return False
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)  # also NaN, inf, -inf, Infinity, -Infinity
    except ValueError:
        return s


def normalize(v):
    if isinstance(v, Decimal):
        return float(v)
    return v


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def cells_equal(a, b):
    a, b = normalize(a), normalize(b)
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        if isinstance(a, bool) and isinstance(b, bool):
            return a == b
        if is_number(a) or is_number(b):  # SQLite has no booleans: 1/0
            return float(a) == float(b)
        return False
    if is_number(a) and is_number(b):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        fa, fb = float(a), float(b)
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        if math.isinf(fa) or math.isinf(fb):
            return fa == fb
        diff = abs(fa - fb)
        return diff <= ABS_TOL or diff <= REL_TOL * max(abs(fa), abs(fb))
    return a == b


def compare_rows(expected, actual):
    """None when equal, else a description of the first difference."""
    if len(expected) != len(actual):
        return (
            f"row count: expected {len(expected)}, got {len(actual)}"
            f" (expected first rows {expected[:3]}, got {actual[:3]})"
        )
    for r, (e, a) in enumerate(zip(expected, actual)):
        if len(e) != len(a):
            return f"row {r}: expected {len(e)} columns {e}, got {len(a)} columns {a}"
        for c, (x, y) in enumerate(zip(e, a)):
            if not cells_equal(x, y):
                return f"row {r} column {c}: expected {x!r}, got {normalize(y)!r} (expected row {e}, got row {tuple(a)})"
    return None


# --------------------------------------------------------------------------
# dfgrad
# --------------------------------------------------------------------------

SEP_PREFIX = "@@dfgrad-sep "
SEP_RE = re.compile(r"^SELECT '@@dfgrad-sep (\S+)@@' AS dfgrad_sep;?$")
SEP_VALUE_RE = re.compile(r"^@@dfgrad-sep (\S+)@@$")


def sep(tag):
    return f"SELECT '{SEP_PREFIX}{tag}@@' AS dfgrad_sep"


class Dfgrad:
    def __init__(self, binary, table_paths):
        self.binary = str(binary)
        self.table_args = []
        for name, path in table_paths.items():
            self.table_args += ["--table", f"{name}={path}"]

    def call(self, args):
        cmd = [self.binary, *self.table_args, *args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=DFGRAD_TIMEOUT)
        except subprocess.TimeoutExpired:
            return 124, "", f"dfgrad timed out after {DFGRAD_TIMEOUT}s"
        except OSError as e:
            return 127, "", f"cannot run {self.binary}: {e}"
        return p.returncode, p.stdout, p.stderr

    def batch(self, units, mode):
        """Runs `units` [(key, [statement, ...])] in as few dfgrad processes as
        possible. mode is a dialect name (`--rewrite`) or None (run, CSV).

        Returns {key: ("ok", value) | ("error", stderr)}: for a rewrite the
        value is the list of exported statements, for a run the rows of the
        last statement. A failing unit is reported, and the batch goes on
        after it in a new process."""
        results = {}
        pending = list(units)
        while pending:
            args = ["--rewrite", mode] if mode else ["-q", "--format", "csv"]
            for u, (key, statements) in enumerate(pending):
                for i, s in enumerate(statements):
                    args += ["-c", sep(f"{u}.{i}"), "-c", s]
                if not mode:
                    args += ["-c", sep(f"{u}.end")]
            rc, out, err = self.call(args)
            chunks, order = self._chunks(out, run=not mode)
            done = 0
            for u, (key, statements) in enumerate(pending):
                tags = [f"{u}.{i}" for i in range(len(statements))]
                last = f"{u}.end" if not mode else tags[-1]
                if rc != 0 and (last not in chunks or (mode and order and order[-1] == last)):
                    break
                if mode:
                    results[key] = ("ok", ["\n".join(chunks[t]).strip() for t in tags])
                else:
                    results[key] = ("ok", self._rows(chunks[tags[-1]]))
                done = u + 1
            if rc == 0 or done >= len(pending):
                # Every unit printed, or the output cannot be attributed.
                for key, _ in pending[done:]:
                    results[key] = ("error", f"dfgrad (exit {rc}) printed output that cannot be "
                                    f"split at the separators: {one_line(out[-500:])} {one_line(err)}")
                break
            # pending[done] is the failing unit (its statement printed nothing).
            key = pending[done][0]
            results[key] = ("error", err.strip() or f"dfgrad exited with {rc}")
            pending = pending[done + 1:]
        return results

    @staticmethod
    def _chunks(out, run):
        """{tag: [line, ...]} of what was printed after each separator."""
        chunks, order, current = {}, [], None
        lines = out.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for line in lines:
            m = (SEP_VALUE_RE if run else SEP_RE).match(line)
            if m:
                if run and current is not None and chunks[current] and chunks[current][-1] == "dfgrad_sep":
                    chunks[current].pop()  # the separator's CSV header
                current = m.group(1)
                chunks[current] = []
                order.append(current)
            elif current is not None:
                chunks[current].append(line)
        if run and current is not None and chunks[current] and chunks[current][-1] == "dfgrad_sep":
            chunks[current].pop()
        return chunks, order

    @staticmethod
    def _rows(lines):
        if not lines:
            return []
        records = list(csv.reader(io.StringIO("\n".join(lines) + "\n")))
        return [tuple(parse_text_cell(c) for c in r) for r in records[1:]]

    def refuses(self, dialect, statements):
        """None if `--rewrite dialect` fails with [unexportable], else why not."""
        args = ["--rewrite", dialect]
        for s in statements:
            args += ["-c", s]
        rc, out, err = self.call(args)
        if rc == 0:
            return f"expected an [unexportable] refusal, but it exported: {one_line(out)}"
        if "[unexportable]" not in err:
            return f"expected an [unexportable] refusal, got exit {rc}: {one_line(err)}"
        return None


# --------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------


class EngineError(Exception):
    def __init__(self, message, statement=None):
        super().__init__(message)
        self.statement = statement


class DuckDb:
    name = "duckdb"

    def __init__(self, table_paths):
        import duckdb  # noqa: F401 (a failing import fails every duckdb check)

        self.duckdb = duckdb
        self.table_paths = table_paths

    def run(self, statements):
        con = self.duckdb.connect(":memory:")
        try:
            for name, path in self.table_paths.items():
                con.execute(create_table_sql(name, "duckdb"))
                con.execute(f"COPY {name} FROM '{path}' (FORMAT csv, HEADER true, NULLSTR '')")
            return run_with_timeout(con, statements)
        finally:
            con.close()


class Sqlite:
    name = "sqlite"

    def __init__(self, table_paths):
        import sqlite3

        self.sqlite3 = sqlite3
        con = sqlite3.connect(":memory:")
        try:
            con.execute("SELECT sin(1.0)")
        except sqlite3.OperationalError as e:
            raise RuntimeError(f"SQLite {sqlite3.sqlite_version} lacks math functions: {e}") from e
        finally:
            con.close()

    def run(self, statements):
        con = self.sqlite3.connect(":memory:")
        try:
            for name, (columns, rows) in TABLES.items():
                con.execute(create_table_sql(name, "sqlite"))
                marks = ", ".join("?" for _ in columns)
                con.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
            return run_with_timeout(con, statements)
        finally:
            con.close()


def pg_bin_dir():
    env = os.environ.get("PG_BIN")
    if env:
        return Path(env)
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for c in reversed(candidates):
        if (c / "initdb").exists() and (c / "pg_ctl").exists() and (c / "psql").exists():
            return c
    for tool in ("initdb", "pg_ctl", "psql"):
        if not shutil.which(tool):
            raise RuntimeError("PostgreSQL server binaries not found (run .ci/setup)")
    return Path(shutil.which("initdb")).parent


class Postgres:
    """A throwaway cluster in a temporary directory, reached over a Unix
    socket in that directory; stopped and removed by close()."""

    name = "postgres"
    port = "54329"

    def __init__(self, table_paths):
        self.bin = pg_bin_dir()
        self.base = Path(tempfile.mkdtemp(prefix="dfgrad-engines-pg-"))
        self.data = self.base / "data"
        self.started = False
        self.as_user = []
        atexit.register(self.close)
        if os.geteuid() == 0:
            import pwd

            try:
                pw = pwd.getpwnam("postgres")
            except KeyError as e:
                raise RuntimeError("running as root but there is no `postgres` user") from e
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._server(
            [str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
             "-E", "UTF8", "--locale=C", "--no-sync"]
        )
        opts = f"-k {self.base} -c listen_addresses='' -p {self.port} -c fsync=off"
        self._server(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "log"),
             "-o", opts, "-w", "-t", "60", "start"]
        )
        self.started = True
        setup = []
        for name, path in table_paths.items():
            setup.append(create_table_sql(name, "postgres") + ";")
            setup.append(f"\\copy {name} FROM '{path}' WITH (FORMAT csv, HEADER true)")
        self._psql("\n".join(setup) + "\n")

    def _server(self, cmd):
        p = subprocess.run(self.as_user + cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            log = self.base / "log"
            extra = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd[:1])} failed: {p.stdout}{p.stderr}{extra}")

    def _psql(self, script):
        cmd = [str(self.bin / "psql"), "-X", "-q", "--csv", "-t", "-v", "ON_ERROR_STOP=1",
               "-h", str(self.base), "-p", self.port, "-U", "postgres", "-d", "postgres", "-f", "-"]
        p = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=ENGINE_TIMEOUT)
        if p.returncode != 0:
            raise EngineError(p.stderr.strip() or f"psql exited with {p.returncode}")
        return p.stdout

    def run(self, statements):
        # One transaction, rolled back: cases do not see each other's tables.
        lines = ["BEGIN;", "\\o /dev/null"]
        for s in statements[:-1]:
            lines.append(s + ";")
        lines.append("\\o")
        lines.append(statements[-1] + ";")
        lines.append("ROLLBACK;")
        try:
            out = self._psql("\n".join(lines) + "\n")
        except EngineError as e:
            # psql names the failing line: find its statement.
            raise EngineError(str(e), self._failing(statements, str(e))) from e
        records = list(csv.reader(io.StringIO(out)))
        return [tuple(parse_text_cell(c, "t", "f") for c in r) for r in records]

    @staticmethod
    def _failing(statements, err):
        m = re.search(r"<stdin>:(\d+):", err)
        if not m:
            return None
        line = int(m.group(1))
        at = 2  # BEGIN; and \o
        for i, s in enumerate(statements):
            at += s.count("\n") + 1 + (1 if i == len(statements) - 1 else 0)
            if line <= at:
                return s
        return None

    def close(self):
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self.started:
            subprocess.run(
                self.as_user + [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                                "-w", "stop"],
                capture_output=True, timeout=60,
            )
        shutil.rmtree(self.base, ignore_errors=True)


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def run_with_timeout(con, statements):
    """Runs `statements` on a DB-API connection with interrupt(), the last
    one's rows (or [] when it returns none); a statement still running after
    ENGINE_TIMEOUT seconds is interrupted."""
    timer = threading.Timer(ENGINE_TIMEOUT, con.interrupt)
    timer.start()
    try:
        rows = None
        for s in statements:
            try:
                cur = con.execute(s)
                rows = cur.fetchall() if cur.description else None
            except Exception as e:  # noqa: BLE001 (any engine error)
                raise EngineError(f"{type(e).__name__}: {e}", s) from e
        return [tuple(r) for r in rows or []]
    finally:
        timer.cancel()


def one_line(text, limit=None):
    text = re.sub(r"\s*\n\s*", " ", str(text)).strip()
    if limit and len(text) > limit:
        text = text[:limit] + f" …[{len(text) - limit} more chars]"
    return text


def default_binary():
    env = os.environ.get("DFGRAD")
    if env:
        return env
    target = os.environ.get("CARGO_TARGET_DIR") or str(Path.home() / ".cache/datafusion-grad/target")
    return str(Path(target) / "debug" / "dfgrad")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dfgrad", nargs="?", default=default_binary(), help="path of the dfgrad binary")
    ap.add_argument("--corpus", default=str(HERE / "corpus.sql"))
    ap.add_argument("--only", help="run only the cases whose name matches this regex")
    ap.add_argument("--dialect", action="append", choices=DIALECTS, help="check only these dialects")
    ap.add_argument("--full", action="store_true", help="print exported SQL in full in failure lines")
    ap.add_argument("--show", action="store_true", help="print every exported statement")
    opts = ap.parse_args()

    # SIGTERM (CI timeouts) runs the cleanup handlers too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    started = time.monotonic()
    cases = parse_corpus(opts.corpus)
    if opts.only:
        cases = [c for c in cases if re.search(opts.only, c.name)]
    dialects = opts.dialect or DIALECTS
    limit = None if opts.full else MAX_SQL_IN_REPORT

    passed = 0
    failures = []

    def fail(case, dialect, message, sql=None):
        line = f"FAIL {case.name} [{dialect}]: {one_line(message, 1500)}"
        if sql:
            line += f" | exported: {one_line(sql, limit)}"
        failures.append(line)
        print(line, flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="dfgrad-engines-"))
    atexit.register(shutil.rmtree, workdir, True)
    table_paths = write_tables(workdir)

    binary = Path(opts.dfgrad)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        print(f"dfgrad binary not found or not executable: {binary} (build it with cargo build)", flush=True)
        total = len(cases) * len(dialects)
        print(f"0 passed, {total} failed")
        return 1
    dfgrad = Dfgrad(binary, table_paths)

    # Engines: failing to import or start one fails its checks.
    engines, engine_errors = {}, {}
    pg = None
    for d, cls in (("duckdb", DuckDb), ("postgres", Postgres), ("sqlite", Sqlite)):
        if d not in dialects:
            continue
        try:
            engines[d] = cls(table_paths)
            if d == "postgres":
                pg = engines[d]
        except Exception as e:  # noqa: BLE001
            engine_errors[d] = f"{d} unavailable: {type(e).__name__}: {e}"
            print(f"ERROR {engine_errors[d]}", flush=True)

    try:
        # Reference results, and every dialect's export, from dfgrad.
        units = [(c.name, c.statements) for c in cases]
        with ThreadPoolExecutor(max_workers=2) as pool:
            ref_future = pool.submit(dfgrad.batch, units, None)
            export_futures = {
                d: pool.submit(
                    dfgrad.batch,
                    [(c.name, c.statements) for c in cases if d not in c.refuse],
                    d,
                )
                for d in dialects
            }
            refusal_futures = {
                (c.name, d): pool.submit(dfgrad.refuses, d, c.statements)
                for c in cases
                for d in dialects
                if d in c.refuse
            }
            reference = ref_future.result()
            exports = {d: f.result() for d, f in export_futures.items()}
            refusals = {k: f.result() for k, f in refusal_futures.items()}

        # The datafusion dialect runs back through dfgrad, in one batch.
        roundtrip = {}
        if "datafusion" in dialects:
            ok = [
                (c.name, exports["datafusion"][c.name][1])
                for c in cases
                if "datafusion" not in c.refuse and exports["datafusion"][c.name][0] == "ok"
            ]
            roundtrip = dfgrad.batch(ok, None)

        for case in cases:
            ref = reference[case.name]
            for d in dialects:
                if d in case.refuse:
                    why = refusals[(case.name, d)]
                    if why:
                        fail(case, d, why)
                    else:
                        passed += 1
                    continue
                if ref[0] != "ok":
                    fail(case, d, f"the original fails in dfgrad (no reference result): {ref[1]}")
                    continue
                status, exported = exports[d][case.name]
                if status != "ok":
                    fail(case, d, f"dfgrad --rewrite {d} failed: {exported}")
                    continue
                marked = "; ".join(
                    e for e, s in zip(exported, case.statements) if e != s
                ) or "; ".join(exported)
                if opts.show:
                    print(f"EXPORT {case.name} [{d}]: {one_line('; '.join(exported))}")
                if d == "datafusion":
                    status, rows = roundtrip[case.name]
                    if status != "ok":
                        fail(case, d, f"exported SQL fails in dfgrad: {rows}", marked)
                        continue
                elif d in engine_errors:
                    fail(case, d, engine_errors[d])
                    continue
                else:
                    try:
                        rows = engines[d].run(exported)
                    except EngineError as e:
                        fail(case, d, f"{d} error: {e}", e.statement or marked)
                        continue
                    except Exception as e:  # noqa: BLE001
                        fail(case, d, f"{d} error: {type(e).__name__}: {e}", marked)
                        continue
                diff = compare_rows(ref[1], rows)
                if diff:
                    fail(case, d, f"results differ: {diff}", marked)
                else:
                    passed += 1
    finally:
        if pg is not None:
            pg.close()

    elapsed = time.monotonic() - started
    print(f"# {len(cases)} cases x {len(dialects)} dialects in {elapsed:.1f}s", flush=True)
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
