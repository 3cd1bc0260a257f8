"""The runtime process's start-up: one digits job, end to end, against its floor.

Side by side, in interleaved rounds, each in a fresh process and a fresh job folder:
  floor    `python -c` that imports numpy and onnxruntime, loads the example digits
           model and runs its 8 rows: what any fresh process that runs this model pays.
  runtime  `python -m gpu_share.agent.runtimes.onnx spec.json` in a prepared job folder
           (`spec.json` written as the agent writes it, the model and inputs under
           `in/`), no sandbox: our process alone, to `result.json`.
  process  the same job started as the agent starts it (`SandboxSpec`, the job's
           limits as rlimits, the supervisor), through the unisolated process sandbox.
  bwrap    the same through the agent's bubblewrap sandbox, when bwrap works here.
Prints p50 and p99 of each and each p50 over the floor's.

`--before DIR` adds the same three runs with the runtime imported from another source
tree (for example the committed code: `git archive HEAD src | tar -x -C /tmp/before`),
in the same interleaved rounds, to measure a change before and after in one go.

Run: .venv/bin/python bench/runtime_start.py [--rounds 20] [--threads 1]
     [--before /tmp/before/src]
"""

import argparse
import asyncio
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpu_share.agent.runtimes.jobspec import RUNTIME_MODULES, JobSpec
from gpu_share.agent.sandbox import (
    JobLimits,
    LimitedSandbox,
    ProcessSandbox,
    Sandbox,
    SandboxSpec,
    SandboxUnavailable,
)
from gpu_share.agent.sandbox.bwrap import detect_bwrap, outermost
from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.protocol.runtimes import RuntimeName

RUNTIME = RuntimeName.ONNX_CPU
FLOOR = """
import numpy as np, onnxruntime as ort
options = ort.SessionOptions()
options.intra_op_num_threads = {threads}
session = ort.InferenceSession({model!r}, sess_options=options, providers=["CPUExecutionProvider"])
inputs = dict(np.load({inputs!r}))
session.run(None, inputs)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cached_artifacts(root: Path) -> dict[str, Path]:
    """The model and inputs where the agent keeps them: in its cache, outside the Python
    installation (the bwrap sandbox refuses to bind a file every job could read)."""
    cache = root / "cache"
    cache.mkdir()
    artifacts = {"model": cache / "model", "inputs": cache / "inputs"}
    shutil.copyfile(DIGITS_MODEL, artifacts["model"])
    shutil.copyfile(DIGITS_INPUTS, artifacts["inputs"])
    return artifacts


def job_folder(root: Path, threads: int, *, copy_inputs: bool) -> Path:
    """A fresh job folder with `spec.json` as `jobs.Job` writes it; the inputs are copied
    in only where no sandbox puts them there."""
    directory = Path(tempfile.mkdtemp(prefix="job-", dir=root / "jobs"))
    spec = JobSpec(
        runtime=RUNTIME,
        model="in/model",
        inputs="in/inputs",
        outputs_dir="out",
        threads=threads,
        memory_limit_bytes=2 * 1024**3,
        options={},
    )
    (directory / "spec.json").write_text(spec.model_dump_json())
    if copy_inputs:
        (directory / "in").mkdir()
        shutil.copyfile(root / "cache" / "model", directory / "in" / "model")
        shutil.copyfile(root / "cache" / "inputs", directory / "in" / "inputs")
    return directory


def check_done(directory: Path, log: bytes | str = b"") -> None:
    result = json.loads((directory / "out" / "result.json").read_text())
    if not result["ok"]:
        raise SystemExit(f"the digits job failed: {result} {log!r}")
    shutil.rmtree(directory, ignore_errors=True)


def run_floor(threads: int) -> float:
    code = FLOOR.format(threads=threads, model=str(DIGITS_MODEL), inputs=str(DIGITS_INPUTS))
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return (time.perf_counter() - started) * 1000


def run_runtime(root: Path, threads: int, pythonpath: str | None) -> float:
    directory = job_folder(root, threads, copy_inputs=True)
    env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONUNBUFFERED": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", RUNTIME_MODULES[RUNTIME], "spec.json"],
        cwd=directory,
        env=env,
        capture_output=True,
        check=False,
    )
    elapsed = (time.perf_counter() - started) * 1000
    check_done(directory, done.stderr)
    return elapsed


async def run_sandboxed(
    sandbox: Sandbox,
    root: Path,
    artifacts: dict[str, Path],
    threads: int,
    pythonpath: str | None,
) -> float:
    directory = job_folder(root, threads, copy_inputs=False)
    spec = SandboxSpec(
        argv=[sys.executable, "-m", RUNTIME_MODULES[RUNTIME], "spec.json"],
        job_dir=directory,
        inputs=artifacts,
        env={"PYTHONPATH": pythonpath} if pythonpath else {},
        cpu_threads=threads,
        limits=JobLimits(memory_bytes=2 * 1024**3, cgroups=False).for_wall_time(60),
    )
    started = time.perf_counter()
    process = await sandbox.start(spec)
    log = await process.stdout.read()
    code = await process.wait()
    elapsed = (time.perf_counter() - started) * 1000
    if code != 0:
        raise SystemExit(f"the sandboxed job exited {code}: {log.decode(errors='replace')}")
    check_done(directory, log)
    return elapsed


def bwrap_sandbox(pythonpath: str | None) -> Sandbox | None:
    try:
        sandbox = detect_bwrap()
    except SandboxUnavailable as exc:
        print(f"bwrap: not measured ({exc})")
        return None
    if pythonpath:
        sandbox.runtime_paths = outermost([*sandbox.runtime_paths, Path(pythonpath).resolve()])
    return LimitedSandbox(sandbox, JobLimits(cgroups=False))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--before",
        metavar="DIR",
        help="also run the runtime from this source tree, interleaved with this checkout's",
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="gpu-share-runtime-start-"))
    (root / "jobs").mkdir(mode=0o700)  # as the agent keeps its jobs folder
    artifacts = cached_artifacts(root)
    threads = args.threads
    variants: dict[str, Callable[[], Awaitable[float]]] = {
        "floor": lambda: asyncio.to_thread(run_floor, threads),
    }
    sources = {"": None} if args.before is None else {"": None, " before": args.before}
    for suffix, source in sources.items():
        process_sandbox = LimitedSandbox(ProcessSandbox(), JobLimits(cgroups=False))
        bwrap = bwrap_sandbox(source)
        variants[f"runtime{suffix}"] = functools.partial(
            asyncio.to_thread, run_runtime, root, threads, source
        )
        variants[f"process{suffix}"] = functools.partial(
            run_sandboxed, process_sandbox, root, artifacts, threads, source
        )
        if bwrap is not None:
            variants[f"bwrap{suffix}"] = functools.partial(
                run_sandboxed, bwrap, root, artifacts, threads, source
            )
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for run in variants.values():  # warm the page cache; not counted
            await run()
        for round_ in range(args.rounds):
            names = list(variants)
            shift = round_ % len(names)  # each variant goes first as often as the others
            for name in names[shift:] + names[:shift]:
                times[name].append(await variants[name]())
    finally:
        shutil.rmtree(root, ignore_errors=True)

    floor = statistics.median(times["floor"])
    print(f"digits job, {args.rounds} interleaved rounds, {threads} thread(s)", end="")
    print(f"; 'before': the runtime from {args.before}:" if args.before else ":")
    print(f"    {'':15} {'p50 ms':>8} {'p99 ms':>8} {'p50 / floor':>12}")
    for name, values in times.items():
        p50 = statistics.median(values)
        print(f"    {name:15} {p50:8.0f} {percentile(values, 0.99):8.0f} {p50 / floor:12.2f}")
    for suffix in sources:
        over = statistics.median(times[f"runtime{suffix}"]) - floor
        print(f"    the runtime process{suffix} costs {over:.0f} ms over the floor")


if __name__ == "__main__":
    asyncio.run(main())
