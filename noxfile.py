"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s docs`, `nox -s benchmarks`, `nox -s mutants`,
`nox -s gpu`."""

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
    """ruff on everything, mypy on the package's public API, and the package's layers (tests/test_layers.py:
    imports go only downward, core < launch < data < transforms < checking < checkpoint < driver < the top
    level, without cycles)."""
    session.install("-e", ".[lint]", "pytest", "pytest-xdist")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("python", "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "tests/test_layers.py")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (MkDocs, Material, mkdocstrings): built strictly into site/, where a broken link or
    anchor, a page left out of the navigation or a public name without its reference entry fails; `nox -s docs --
    serve` serves it at http://127.0.0.1:8000. Only the `[docs]` extra is installed: mkdocstrings reads the package's
    source, so neither torch nor the package is."""
    session.install(*nox.project.load_toml("pyproject.toml")["project"]["optional-dependencies"]["docs"])
    session.env["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about MkDocs 2
    session.run("mkdocs", *(session.posargs or ["build", "--strict"]))


@nox.session
def benchmarks(session: nox.Session) -> None:
    """Every benchmark of benchmarks/ on the CPU, side by side with Lightning, Accelerate and HF Trainer; prints
    markdown tables (benchmarks/README.md holds the figures and the commands of their GPU versions)."""
    session.install("-e", ".[bench,examples,hdf5]")  # bench_cache decodes images (torchvision) and reads HDF5
    session.chdir("benchmarks")
    torchrun = ("python", "-m", "torch.distributed.run", "--nproc-per-node=2")
    session.run("python", "bench_accumulate.py", *session.posargs)
    session.run("python", "bench_memory.py")
    session.run("python", "bench_precision.py")
    session.run(*torchrun, "bench_distributed.py")
    session.run(*torchrun, "bench_sharded.py")
    session.run("python", "bench_run.py")
    session.run("python", "bench_gpt.py")
    session.run("python", "bench_compile.py", "--restarts", "1")
    session.run("python", "bench_parallel.py")
    session.run("python", "-m", "torch.distributed.run", "--nproc-per-node=4", "bench_meshes.py")
    session.run("python", "bench_checkpoint.py")
    session.run("python", "bench_checkpoint_async.py")
    session.run("python", "bench_cache.py")
    session.run("python", "bench_hf.py")
    session.run("python", "bench_resume.py")
    session.run("python", "bench_observe.py")
    session.run("python", "bench_tokens.py")


@nox.session
def mutants(session: nox.Session) -> None:
    """Replay the planted bugs of mutants/*.py, one catalogue per module they are planted in (`nox -s mutants --
    transforms_ema` for one module's): each must be caught. Part of every change's definition of done: add the
    change's own planted bugs (a catalogue of its own, filed by module with `python tools/regroup_mutants.py`)."""
    session.install("-e", ".[test]")
    session.run("python", "tools/mutants.py", *session.posargs)


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """On a machine with CUDA, in an environment that already has `.[test]` installed (a device
    machine may reach no package index): the GPU tests, then the GPU benchmarks. Under 8 minutes
    on one H200."""
    session.run("python", "-c", "import torch; assert torch.cuda.is_available(), 'nox -s gpu needs CUDA'")
    session.run("python", "-m", "pytest", "-m", "gpu", "-q", "-n", "0", "-p", "no:cacheprovider", *session.posargs)
    session.chdir("benchmarks")
    for model in ("resnet50", "transformer"):
        session.run(
            "python", "bench_precision.py", "--device", "cuda", "--model", model, "--dtypes", "fp32", "bf16", "fp16"
        )
    session.run("python", "bench_memory.py", "--device", "cuda")
    # HSDP, TP and PP bytes per rank on 4 GPUs over nccl (skipped, saying so, with fewer)
    session.run("python", "bench_meshes.py", "--device", "cuda", "--width", "2048", "--depth", "8", "--launch")
    session.run("python", "bench_gpt.py", "--device", "cuda", "--rounds", "21", "--updates", "20")
    # ct.compile against the hand-compiled loop, and one warm/cold restart (about 3 minutes, most of it compiling)
    session.run(
        "python", "bench_compile.py", "--device", "cuda", "--rounds", "11", "--updates", "20", "--restarts", "1"
    )
