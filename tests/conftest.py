import os

import pytest
from hypothesis import HealthCheck, settings

# every phase of every test runs under a time limit (CT_TEST_TIMEOUT): a hang fails, naming the test and the phase
from time_limit import pytest_configure, pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown  # noqa: F401

# "dev" explores more; "ci" (the default) keeps the suite well inside CI's budget on two cores.
settings.register_profile(
    "ci", max_examples=40, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=300, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def uninterrupted_elastic_job(tmp_path_factory):
    """tests/elastic_job.py straight through under torchrun (2 processes): what a killed and restarted,
    pre-empted and requeued, or srun-launched job must end bit-identical to (test_elastic, test_slurm)."""
    from elastic_runs import torchrun

    results, _, _ = torchrun(tmp_path_factory.mktemp("reference"), "reference")
    return results


@pytest.fixture(scope="module")
def pool():
    """Two gloo ranks for a test file's multi-rank checks (``pool.run(__name__, function, *args)``); one per
    file, so that a pool killed by one file's failure cannot fail the next file."""
    from processes import Pool

    p = Pool(2)
    yield p
    p.close()


@pytest.fixture
def fresh_dynamo():
    """A test that compiles starts from nothing and counts its own compilations (test_compile*.py)."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def s3_server():
    """One S3-compatible server (moto's, in a process of its own on 127.0.0.1) for the object storage tests;
    they skip without moto or s3fs."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from processes import S3Server

    server = S3Server()
    yield server
    server.close()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """``s3_server`` with this process's environment pointing at it (credentials, endpoint)."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


# Under pytest-xdist (pyproject's addopts: `-n auto --dist loadfile`) each test module runs on one worker, and the
# modules share the workers, those that start processes of their own too (`free_port` gives each worker its own
# ports). Whole modules: tests/test_slurm.py starts one SLURM cluster per process, on SLURM's fixed ports, and its
# tests must share it. (xdist_group markers do nothing under pytest 9 with pytest-xdist 3.8: xdist writes the group
# into an attribute pytest no longer reads, so a group of every process-starting test, meant to run serially, was
# never one; two full runs and CI ran those tests side by side without a race.)
