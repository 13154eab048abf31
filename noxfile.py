"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s benchmarks`."""

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (what .ci/run runs)."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff on everything, mypy on the package's public API."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def benchmarks(session: nox.Session) -> None:
    """Every benchmark, side by side with Lightning and Accelerate; prints markdown tables."""
    session.install("-e", ".[bench]")
    session.chdir("benchmarks")
    session.run("python", "bench_accumulate.py", *session.posargs)
    session.run("python", "bench_memory.py")
    session.run("python", "bench_precision.py")
    session.run("python", "-m", "torch.distributed.run", "--nproc-per-node=2", "bench_distributed.py")
    session.run("python", "bench_run.py")
    session.run("python", "bench_parallel.py")
