"""A time limit on every phase of every test (its setup, call and teardown): no test may hang the suite.

Each phase may run ``CT_TEST_TIMEOUT`` seconds (default 900; CI's whole budget is 20 minutes). Past that,
SIGALRM fails the test, naming it and the phase (on the session's stderr at once, too): it interrupts
whatever Python waits in (a queue, a subprocess, a sleep). A wait that no signal interrupts (a collective
inside C++, say) is ended ``CT_TEST_TIMEOUT_GRACE`` seconds (default 60) later by a watchdog thread: it
names the test and the phase, dumps every thread's traceback, kills every process the tests started, and
ends the session with exit status 1. Loaded from tests/conftest.py; ``-p time_limit`` loads it elsewhere
(test_processes.py does).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

STATUS = 1  # the session's exit status when the watchdog ends it
_stderr: Any = None  # the session's own stderr, not a test's captured one


def limits() -> tuple[float, float]:
    """(the limit of one phase, the watchdog's grace after it), in seconds, from the environment."""
    values = []
    for name, default in (("CT_TEST_TIMEOUT", "900"), ("CT_TEST_TIMEOUT_GRACE", "60")):
        text = os.environ.get(name, default)
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise pytest.UsageError(f"time_limit: {name} must be a positive number of seconds, got {text!r}")
        values.append(value)
    return values[0], values[1]


def pytest_configure(config: pytest.Config) -> None:
    global _stderr
    limits()  # a bad value stops the session before any test runs
    if _stderr is None:  # here fd 2 is still the terminal or the CI log: a test's capture replaces it later
        _stderr = os.fdopen(os.dup(2), "w")


def _watchdog(what: str, after: float) -> None:
    """The last resort, in a thread of its own: the main thread is stuck where SIGALRM cannot reach."""
    from processes import kill_tree

    _stderr.write(f"\ntime_limit: {what}, and SIGALRM did not end it {after:g}s later; ending the session\n")
    _stderr.flush()
    faulthandler.dump_traceback(file=_stderr, all_threads=True)
    _stderr.flush()
    kill_tree(os.getpid())  # every process the tests started (never this one)
    os._exit(STATUS)


@contextlib.contextmanager
def _limited(item: pytest.Item, phase: str) -> Iterator[None]:
    limit, grace = limits()
    what = f"{item.nodeid}: still running after {limit:g}s in its {phase}"

    def alarm(signum: int, frame: Any) -> None:
        message = f"time_limit: {what} (CT_TEST_TIMEOUT={limit:g}); failing it"
        _stderr.write(f"\n{message}\n")  # in the log at once, whatever ends the session later
        _stderr.flush()
        pytest.fail(message)

    previous = signal.signal(signal.SIGALRM, alarm)
    watchdog = threading.Timer(limit + grace, _watchdog, (what, grace))
    watchdog.daemon = True
    watchdog.start()
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        watchdog.cancel()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _limited(item, "setup"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _limited(item, "call"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with _limited(item, "teardown"):
        yield
