"""What watching costs: ct.run's new record fields, and a profiler window outside its updates.

    git archive 0190e9d src | tar -x -C /tmp/base      # the code before the record fields (issue 36)
    python benchmarks/bench_observe.py --base-src /tmp/base/src --rounds 11

1. Record fields: ct.run with the records' throughput fields (samples/s, FLOPs counted once on the first update,
   peak memory, the per-rank timings gathered at log points) against ct.run of the code before them (``--base-src``),
   each in a process of its own that imports its tree, driven in interleaved rounds by this one (each round: both,
   in rotating order, the same updates). Leave ``--base-src`` out to skip this part.
2. Profiler window: ct.run with a window configured that these updates never reach (``profile={"wait": 10**9}``)
   against ct.run without one, interleaved in this process: the cost of a window outside its updates.

Both on the MLP of bench_run.py (256-512x3-10, batch 256, fp32, an in-memory TensorDataset that ct.run reads
a batch at a time), log_every=50, one ct.run call per round and contender (its start-up included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Result, compare, report

HERE = Path(__file__).resolve().parent


def _workload():
    """The model, its state and the data (in the process that times them)."""
    import torch
    from bench_accumulate import make_model, step

    import composetrain as ct

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8192, 256), torch.randint(0, 10, (8192,)))
    model = make_model(512, 3)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    return ct, step, state, data


def _timed_run(ct, step, state, data, updates: int, **options) -> float:
    start = time.perf_counter()
    ct.run(
        step,
        state,
        data,
        batch_size=256,
        max_steps=state.step + updates,
        progress=False,
        log_every=50,
        num_workers=0,
        **options,
    )
    return time.perf_counter() - start


def child() -> None:
    """A contender of part 1: reads an update count per line, answers the seconds ct.run took for them."""
    ct, step, state, data = _workload()
    _timed_run(ct, step, state, data, 20)  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        print(_timed_run(ct, step, state, data, int(line)), flush=True)


class Child:
    def __init__(self, src: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(HERE)])}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "bench_observe.py"), "--child"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=HERE,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def __call__(self, updates: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{updates}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-src", help="the src/ folder of the code to compare with (part 1)")
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child()
    import torch

    threads = torch.get_num_threads()
    load = os.getloadavg()[0]
    if args.base_src:
        here = str(HERE.parent / "src")
        contenders = {"ct.run before the record fields": Child(args.base_src), "ct.run with them": Child(here)}
        try:
            results = compare(contenders, updates=args.updates, rounds=args.rounds)  # type: ignore[arg-type]
        finally:
            for c in contenders.values():
                c.close()
        title = f"Record fields: MLP 256-512x3-10, batch 256, {threads} threads, load average {load:.1f} at the start"
        print(report(title, results, "ct.run before the record fields") + "\n")

    ct, step, _, data = _workload()
    folder = tempfile.mkdtemp()
    runs = {}
    for name, options in {
        "ct.run": {},
        "ct.run, a window outside these updates": {"profile": {"wait": 10**9, "folder": folder}},
    }.items():
        _, _, state, _ = _workload()
        runs[name] = lambda n, s=state, o=options: _timed_run(ct, step, s, data, n, **o)
    results: list[Result] = compare(runs, updates=args.updates, rounds=args.rounds)
    title = f"Profiler window outside its updates: same model, {threads} threads, load {os.getloadavg()[0]:.1f}"
    print(report(title, results, "ct.run"))
    assert not any(Path(folder).iterdir()), "a window that was never reached wrote a trace"
    speeds = [round(statistics.median(r.rates), 1) for r in results]
    print(f"\n(load average at the end {os.getloadavg()[0]:.1f}; median speeds {speeds})")


if __name__ == "__main__":
    main()
