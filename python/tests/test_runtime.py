"""Queries release the GIL, and Ctrl-C cancels them."""

import _thread
import threading
import time

import pytest

import datafusion_grad as dg

# A query that runs for minutes unless cancelled.
ENDLESS = "SELECT sum(grad(value * value, value)) AS s FROM range(0, 100000000000)"


def test_ctrl_c_cancels_a_running_query():
    ctx = dg.SessionContext()
    timer = threading.Timer(0.5, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        ctx.sql(ENDLESS).collect()
    assert time.monotonic() - start < 10
    # the session is still usable afterwards
    assert ctx.sql("SELECT 1 AS one").to_pydict() == {"one": [1]}


def test_gil_is_released_while_a_query_runs():
    ctx = dg.SessionContext()
    ticks = 0
    done = threading.Event()

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    time.sleep(0.05)
    try:
        before, start = ticks, time.monotonic()
        ctx.sql("SELECT sum(grad(value * value, value)) AS s FROM range(0, 50000000)").collect()
        during, took = ticks - before, time.monotonic() - start
    finally:
        done.set()
        counter.join()
    # holding the GIL, the counter could not run at all while Rust works
    assert took > 0.05, took
    assert during > 0.1 * took * 1000 / 2, (during, took)
