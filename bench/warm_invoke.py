"""A digits job through a warm sandbox, against the cold path and the floor.

Side by side, in interleaved rounds (the order rotates each round):
  floor  in this process: load the example digits model into a fresh onnxruntime
         session and run its 8 rows. What a job costs with no process start at all.
  cold   the job as the agent starts it today: a prepared job folder (`spec.json`,
         `in/`, `out/`), `Sandbox.start` with the slot's limits, to the process's exit.
  warm   the same job folder handed to a warm sandbox (`WarmPool.hand_over`: inputs and
         spec copied in, the order down its FIFO), to the process's exit.
The agent's work around the start (fetching, reporting) is the same for both paths and
left out. Before each round the pool is refilled (a warm sandbox ready), as it is for
a job that finds an idle agent. For `warm`, the hand-over alone and the time to the
runtime's last log line (stdout's end) are printed too, to show what the rest is.

Each path in the process sandbox and, when bwrap works here, in bubblewrap. Prints
p50 and p99 of each, and each p50 over the floor's and warm over cold.

Run: .venv/bin/python bench/warm_invoke.py [--rounds 30] [--threads 1]
"""

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from gpu_share.agent.runtimes.jobspec import RUNTIME_MODULES, JobSpec
from gpu_share.agent.sandbox import (
    JobLimits,
    LimitedSandbox,
    ProcessSandbox,
    Sandbox,
    SandboxSpec,
    SandboxUnavailable,
)
from gpu_share.agent.sandbox.bwrap import detect_bwrap
from gpu_share.agent.warm import WarmKey, WarmPool
from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.protocol.runtimes import RuntimeName

RUNTIME = RuntimeName.ONNX_CPU
KEY = WarmKey(RUNTIME)
LIMITS = JobLimits(
    memory_bytes=2 * 1024**3, cpus=1, processes=256, open_files=1024, disk_bytes=1024**3
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Bench:
    def __init__(self, root: Path, threads: int) -> None:
        self.root = root
        self.threads = threads
        self.jobs = root / "jobs"
        self.jobs.mkdir(mode=0o700)
        self.cache = root / "cache"
        self.cache.mkdir()
        shutil.copyfile(DIGITS_MODEL, self.cache / "model")
        shutil.copyfile(DIGITS_INPUTS, self.cache / "inputs")
        self.count = 0

    def job(self) -> SandboxSpec:
        self.count += 1
        folder = self.jobs / f"job-{self.count}"
        (folder / "in").mkdir(parents=True)
        (folder / "out").mkdir()
        spec = JobSpec(
            runtime=RUNTIME,
            model="in/model",
            inputs="in/inputs",
            threads=self.threads,
            memory_limit_bytes=LIMITS.memory_bytes,
        )
        (folder / "spec.json").write_text(spec.model_dump_json())
        return SandboxSpec(
            argv=[sys.executable, "-m", RUNTIME_MODULES[RUNTIME], "spec.json"],
            job_dir=folder,
            inputs={"model": self.cache / "model", "inputs": self.cache / "inputs"},
            env={},
            cpu_threads=self.threads,
            limits=LIMITS.for_wall_time(60),
        )

    def floor(self) -> float:
        started = time.perf_counter()
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        session = ort.InferenceSession(
            str(self.cache / "model"), sess_options=options, providers=["CPUExecutionProvider"]
        )
        with np.load(self.cache / "inputs") as archive:
            inputs = {name: archive[name] for name in archive.files}
        session.run(None, inputs)
        return time.perf_counter() - started

    async def cold(self, sandbox: Sandbox) -> float:
        spec = self.job()
        started = time.perf_counter()
        process = await sandbox.start(spec)
        await process.stdout.read()
        code = await process.wait()
        elapsed = time.perf_counter() - started
        assert code == 0 and (spec.job_dir / "out" / "outputs.npz").is_file()
        shutil.rmtree(spec.job_dir)
        return elapsed

    async def warm(self, pool: WarmPool) -> tuple[float, float, float]:
        """(to the exit, the hand-over alone, to the end of stdout)"""
        spec = self.job()
        started = time.perf_counter()
        process = await pool.hand_over(RUNTIME, spec)
        assert process is not None, "no warm sandbox ready"
        handed = time.perf_counter()
        folder = spec.job_dir  # the warm folder, moved there
        await process.stdout.read()
        eof = time.perf_counter()
        code = await process.wait()
        elapsed = time.perf_counter() - started
        assert code == 0 and (folder / "out" / "outputs.npz").is_file()
        shutil.rmtree(folder)
        return elapsed, handed - started, eof - started


async def ready(pool: WarmPool) -> None:
    deadline = time.monotonic() + 60
    while not any(warm.ready.done() and warm.ready.result() for warm in pool.idle.get(KEY, [])):
        if time.monotonic() > deadline:
            raise SystemExit("the pool did not refill within 60 s")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # its imports are done well before: let the machine settle


async def main(rounds: int, threads: int) -> None:
    sandboxes: dict[str, Sandbox] = {"process": LimitedSandbox(ProcessSandbox(), LIMITS)}
    try:
        sandboxes["bwrap"] = LimitedSandbox(detect_bwrap(), LIMITS)
    except SandboxUnavailable as exc:
        print(f"bwrap skipped: {exc}")
    with tempfile.TemporaryDirectory(prefix="gpu-share-warm-bench-") as tmp:
        bench = Bench(Path(tmp), threads)
        pools = {
            name: WarmPool(
                sandbox, warm_dir=bench.root / f"warm-{name}", limits=LIMITS, threads=threads
            )
            for name, sandbox in sandboxes.items()
        }
        times: dict[str, list[float]] = {"floor": []}
        for name in sandboxes:
            for kind in ("cold", "warm", "warm hand-over", "warm to stdout end"):
                times[f"{name} {kind}"] = []
        try:
            bench.floor()  # the first session pays onnxruntime's one-time setup
            for number in range(rounds):
                steps = ["floor", *(f"{n} {k}" for n in sandboxes for k in ("cold", "warm"))]
                shift = number % len(steps)
                for step in steps[shift:] + steps[:shift]:
                    if step == "floor":
                        times["floor"].append(bench.floor())
                        continue
                    name, kind = step.split()
                    if kind == "cold":
                        times[step].append(await bench.cold(sandboxes[name]))
                        continue
                    pools[name].fill([KEY])
                    await ready(pools[name])
                    total, handed, eof = await bench.warm(pools[name])
                    times[step].append(total)
                    times[f"{name} warm hand-over"].append(handed)
                    times[f"{name} warm to stdout end"].append(eof)
                    pools[name].fill([KEY])
                    await ready(pools[name])  # its refill must not run under the next step
        finally:
            for pool in pools.values():
                await pool.close()
    floor = statistics.median(times["floor"])
    print(f"{rounds} rounds, {threads} thread(s), digits (8 rows), interleaved")
    print(f"{'path':28} {'p50 ms':>8} {'p99 ms':>8} {'p50/floor':>10}")
    for name, values in times.items():
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        print(f"{name:28} {p50 * 1000:8.1f} {p99 * 1000:8.1f} {p50 / floor:9.1f}×")
    for name in sandboxes:
        warm = statistics.median(times[f"{name} warm"])
        cold = statistics.median(times[f"{name} cold"])
        print(f"{name}: warm p50 / cold p50 = {warm / cold:.2f} ({cold / warm:.1f}× faster)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.rounds, arguments.threads))
