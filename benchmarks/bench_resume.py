"""Resume anywhere, on the main job: the time from a restart to its first resumed update on W' processes, from a
checkpoint written by W processes against one written by W' (the same launch; only the checkpoint's world size
differs, so the difference is what resuming on another number of processes costs).

    python benchmarks/bench_resume.py                 # 3 rounds
    python benchmarks/bench_resume.py --rounds 5

examples/image_classifier.py (``--width 8``, its global batch of 64) first trains one epoch alone and one on 2
processes (torchrun), each into its own folder. Then each round restarts it once per contender, in rotating order,
from a fresh copy of a folder, for one more epoch: alone from the 2-process checkpoint and from the 1-process one,
on 2 processes from the 1-process checkpoint and from the 2-process one. A restart's time runs from launching the
command to the end of its first update (when the step is called for the second update; every rank writes its time,
then the job is stopped). Medians over rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "image_classifier.py"
ARGS = ["--width", "8", "--batch-size", "64"]


def probe(argv: list[str]) -> None:
    """Run the example, noting the wall-clock time when its step is first called for the second update (the first
    update done: model built, checkpoint read, one update), then wait to be stopped."""
    out, *rest = argv
    sys.path.insert(0, str(EXAMPLE.parent))
    import image_classifier as example

    plain, calls = example.step, []
    micro_batches = int(rest[rest.index("--accumulate") + 1]) if "--accumulate" in rest else 2

    def timed(model, batch):
        calls.append(1)
        if len(calls) == micro_batches + 1:
            Path(f"{out}-rank{os.environ.get('RANK', '0')}").write_text(repr(time.time()))
            while True:
                time.sleep(1)
        return plain(model, batch)

    example.step = timed
    example.main(rest)


def launch(world: int, args: list[str], out: str | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    script = [__file__, "--probe", out] if out else [str(EXAMPLE)]
    launcher = [sys.executable]
    if world > 1:
        with socket.socket() as probe_port:  # a free port for this launch's rendezvous
            probe_port.bind(("127.0.0.1", 0))
            port = probe_port.getsockname()[1]
        launcher += ["-m", "torch.distributed.run", f"--nproc-per-node={world}", f"--master-port={port}"]
    return subprocess.Popen([*launcher, *script, *args], env=env, start_new_session=True)


def restart(world: int, saved: Path, folder: Path) -> float:
    """Seconds from launching the example on ``world`` processes over a copy of ``saved`` to its first update."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(saved, folder)
    out = str(folder) + ".first"
    start = time.time()
    job = launch(world, [*ARGS, "--epochs", "2", "--run-dir", str(folder)], out)
    try:
        marks = [Path(f"{out}-rank{r}") for r in range(world)]
        while not all(m.exists() for m in marks):
            if job.poll() is not None:
                raise RuntimeError(f"the restart on {world} process(es) ended ({job.returncode}) before an update")
            time.sleep(0.05)
        time.sleep(0.1)  # the file was written whole by then
        return max(float(m.read_text()) for m in marks) - start
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ct-bench-resume-") as tmp:
        root = Path(tmp)
        for world in (1, 2):  # one epoch each, to a checkpoint at its end
            job = launch(world, [*ARGS, "--epochs", "1", "--run-dir", str(root / f"saved{world}")])
            if job.wait() != 0:
                raise RuntimeError(f"the first epoch on {world} process(es) failed")
        contenders = {  # (the restart's world size, the world size that saved the checkpoint)
            "1 process, from 2 processes' checkpoint": (1, 2),
            "1 process, from 1 process's checkpoint": (1, 1),
            "2 processes, from 1 process's checkpoint": (2, 1),
            "2 processes, from 2 processes' checkpoint": (2, 2),
        }
        times: dict[str, list[float]] = {name: [] for name in contenders}
        names = list(contenders)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                world, saved = contenders[name]
                times[name].append(restart(world, root / f"saved{saved}", root / f"run-{r}-{world}-{saved}"))
                print(f"round {r + 1}: {name}: {times[name][-1]:.1f} s", flush=True)
    print(f"\n## Time from a restart to its first resumed update, median of {args.rounds} round(s)\n")
    print("| restart | seconds (median) | all rounds |\n|---|---:|---|")
    for name, seconds in times.items():
        print(f"| {name} | {statistics.median(seconds):.1f} | {', '.join(f'{s:.1f}' for s in seconds)} |")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--probe":
        probe(sys.argv[2:])
    else:
        main()
