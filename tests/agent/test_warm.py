"""Warm sandboxes: a runtime started ahead of its job runs it as a cold one would, serves
exactly one job, and is as isolated; the pool refills; a job's end kills it.

The pool tests run on the process sandbox and on bwrap (`GPUSHARE_REQUIRE_BWRAP=1`
makes bwrap mandatory, as in `sandbox/test_bwrap.py`); the agent tests run a real
agent against a real coordinator.
"""

import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import psutil
import pytest

from gpu_share.agent import warm as warm_module
from gpu_share.agent.runtimes.jobspec import RUNTIME_MODULES, JobSpec
from gpu_share.agent.runtimes.warm import GO_FIFO, WARM_FLAG
from gpu_share.agent.sandbox import (
    JobLimits,
    LimitedSandbox,
    ProcessSandbox,
    Sandbox,
    SandboxedProcess,
    SandboxSpec,
)
from gpu_share.agent.sandbox.bwrap import BwrapSandbox
from gpu_share.agent.warm import WarmKey, WarmPool, node_keys
from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.live import Live
from gpu_share.testing.models import slow_model
from tests.agent.sandbox.test_bwrap import Host, bwrap, host  # noqa: F401 - fixtures

CPU = WarmKey(RuntimeName.ONNX_CPU)
LIMITS = JobLimits(
    memory_bytes=2 * 1024**3, cpus=1, processes=256, open_files=1024, disk_bytes=64 * 1024**2
)


@dataclass
class Node:
    """A miniature agent: a private jobs folder, a cache holding the digits example, a pool."""

    jobs: Path
    cache: Path
    sandbox: Sandbox
    pool: WarmPool


@pytest.fixture(params=["process", "bwrap"])
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "bwrap":
        inner: Sandbox = request.getfixturevalue("bwrap")
    else:
        inner = ProcessSandbox()
    return LimitedSandbox(inner, LIMITS)


@pytest.fixture
async def node(tmp_path: Path, sandbox: Sandbox) -> AsyncIterator[Node]:
    jobs, cache = tmp_path / "jobs", tmp_path / "cache"
    jobs.mkdir(mode=0o700)
    cache.mkdir()
    shutil.copyfile(DIGITS_MODEL, cache / "model")
    shutil.copyfile(DIGITS_INPUTS, cache / "inputs")
    pool = WarmPool(sandbox, warm_dir=tmp_path / "warm", limits=LIMITS, threads=1)
    pool.fill([CPU])
    yield Node(jobs, cache, sandbox, pool)
    await pool.close()


def job_spec(
    node: Node, name: str, *, model: Path | None = None, timeout: float = 60
) -> SandboxSpec:
    """A job's folder as `Job._execute` leaves it before the start, and its spec."""
    folder = node.jobs / name
    (folder / "in").mkdir(parents=True)
    (folder / "out").mkdir()
    spec = JobSpec(runtime=RuntimeName.ONNX_CPU, model="in/model", inputs="in/inputs", threads=1)
    (folder / "spec.json").write_text(spec.model_dump_json())
    return SandboxSpec(
        argv=[sys.executable, "-m", RUNTIME_MODULES[RuntimeName.ONNX_CPU], "spec.json"],
        job_dir=folder,
        inputs={"model": model or node.cache / "model", "inputs": node.cache / "inputs"},
        env={},
        cpu_threads=1,
        limits=LIMITS.for_wall_time(timeout),
    )


async def warm_ready(pool: WarmPool, count: int = 1, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while sum(warm.ready.done() and warm.ready.result() for warm in pool.idle.get(CPU, [])) < count:
        assert time.monotonic() < deadline, "the pool did not fill"
        await asyncio.sleep(0.05)


async def hand_over(node: Node, spec: SandboxSpec) -> tuple[SandboxedProcess, Path]:
    await warm_ready(node.pool)
    process = await node.pool.hand_over(RuntimeName.ONNX_CPU, spec)
    assert process is not None, "the job did not get a warm sandbox"
    return process, spec.job_dir


async def finish(process: SandboxedProcess) -> tuple[int, str]:
    output = await asyncio.wait_for(process.stdout.read(), 60)
    return await asyncio.wait_for(process.wait(), 60), output.decode()


def runtime_process(process: SandboxedProcess, within: float = 10) -> psutil.Process:
    """The warm runtime's own process, under its supervisor (and bwrap, which may not have
    started it yet)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for child in psutil.Process(process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.name().startswith("python") and WARM_FLAG in child.cmdline():
                    return child
        time.sleep(0.01)
    raise AssertionError("no warm runtime process under the supervisor")


def comparable(folder: Path, log: str) -> tuple[dict[str, object], dict[str, list[object]], str]:
    """What a job leaves that must not depend on how it started: timings left out."""
    result = json.loads((folder / "out" / "result.json").read_text())
    for timing in ("load_ms", "compute_ms", "peak_rss_bytes"):
        result["metrics"].pop(timing)
    with np.load(folder / "out" / "outputs.npz") as outputs:
        arrays = {name: outputs[name].tolist() for name in outputs.files}
    return result, arrays, re.sub(r"\d+ ms", "N ms", log)


async def test_a_warm_sandbox_runs_digits_as_the_cold_path_does(node: Node) -> None:
    await warm_ready(node.pool)
    [warm] = node.pool.idle[CPU]
    process, folder = await hand_over(node, job_spec(node, "job-a"))
    code, warm_log = await finish(process)
    assert code == 0, warm_log
    assert warm.folder == folder and (folder / "spec.json").is_file()  # in the job's place
    assert sorted(p.name for p in node.jobs.iterdir()) == ["job-a"]

    cold_spec = job_spec(node, "cold-job")
    cold = await node.sandbox.start(cold_spec)
    cold_code, cold_log = await finish(cold)
    assert cold_code == 0, cold_log
    assert comparable(folder, warm_log) == comparable(cold_spec.job_dir, cold_log)
    assert not (folder / GO_FIFO).exists()


async def test_two_jobs_never_share_a_process_or_a_folder(node: Node) -> None:
    await warm_ready(node.pool)
    first_pid = runtime_process(node.pool.idle[CPU][0].process).pid
    first, first_folder = await hand_over(node, job_spec(node, "first"))
    assert (await finish(first))[0] == 0
    node.pool.reported(first_folder)
    await warm_ready(node.pool)
    second_warm = node.pool.idle[CPU][0]
    second_pid = runtime_process(second_warm.process).pid
    # Before its job, the second folder holds its FIFO (and what its own start made: an
    # empty `in`, onnxruntime's `.cache` in HOME), nothing of the first.
    names = {p.name for p in second_warm.folder.iterdir()}
    assert GO_FIFO in names and names <= {GO_FIFO, "in", ".cache"}
    assert not any((second_warm.folder / "in").glob("*"))
    second, second_folder = await hand_over(node, job_spec(node, "second"))
    assert (await finish(second))[0] == 0
    assert second_folder != first_folder and second_pid != first_pid
    assert sorted(p.name for p in second_folder.iterdir() if not p.name.startswith(".")) == [
        "in",
        "out",
        "spec.json",
    ]


async def test_the_pool_refills_after_a_job_and_after_a_death(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warm_module, "REFILL_AFTER_SEC", 600)
    await warm_ready(node.pool)
    process, folder = await hand_over(node, job_spec(node, "job"))
    assert (await finish(process))[0] == 0
    # Not while the job's result is on its way: the start would compete with the report.
    await asyncio.sleep(0.3)
    assert node.pool.starting(CPU) == 0 and not node.pool.idle.get(CPU)
    node.pool.reported(folder)
    await warm_ready(node.pool)  # a new one, once the job is over and reported
    assert node.pool.idle[CPU][0].process is not process

    dead = node.pool.idle[CPU][0]
    dead.process.kill()
    deadline = time.monotonic() + 30
    while not node.pool.idle.get(CPU) or node.pool.idle[CPU][0] is dead:
        assert time.monotonic() < deadline, "a warm process that died was not replaced"
        await asyncio.sleep(0.05)
    assert not dead.folder.exists()


async def test_killing_a_job_in_a_warm_sandbox_ends_its_tree(node: Node) -> None:
    slow = node.cache / "slow"
    slow.write_bytes(slow_model(100_000_000))
    spec = job_spec(node, "slow", model=slow)
    (spec.job_dir / "spec.json").write_text(
        JobSpec(runtime=RuntimeName.ONNX_CPU, model="in/model", threads=1).model_dump_json()
    )
    process, _ = await hand_over(node, replace(spec, inputs={"model": slow}))
    runtime = runtime_process(process)
    await asyncio.sleep(1.0)  # loading and running now
    assert runtime.is_running()
    process.kill()  # what a timeout, a cancel, a preemption or the agent's stop does
    assert await asyncio.wait_for(process.wait(), 30) == -9
    assert not runtime.is_running() or runtime.status() == psutil.STATUS_ZOMBIE


async def test_the_jobs_cpu_time_budget_applies_in_a_warm_sandbox(tmp_path: Path) -> None:
    """Without a cgroup the budget is RLIMIT_CPU, set by the process once its job arrives."""
    limits = replace(LIMITS, cgroups=False)
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o700)
    sandbox = LimitedSandbox(ProcessSandbox(), limits)
    pool = WarmPool(sandbox, warm_dir=tmp_path / "warm", limits=limits, threads=1)
    (tmp_path / "slow").write_bytes(slow_model(100_000_000))
    pool.fill([CPU])
    try:
        spec = job_spec(Node(jobs, tmp_path, sandbox, pool), "slow", timeout=2)
        (spec.job_dir / "spec.json").write_text(
            JobSpec(runtime=RuntimeName.ONNX_CPU, model="in/model", threads=1).model_dump_json()
        )
        spec = replace(spec, inputs={"model": tmp_path / "slow"}, limits=limits.for_wall_time(2))
        process, _ = await hand_over(Node(jobs, tmp_path, sandbox, pool), spec)
        code, _ = await finish(process)
        assert code == -24  # SIGXCPU at 1 CPU × 2 s
        assert process.limit_hit is not None and process.limit_hit.limit == "cpu"
    finally:
        await pool.close()


async def test_a_job_that_does_not_fit_the_pool_starts_cold(node: Node) -> None:
    await warm_ready(node.pool)
    other_limits = replace(job_spec(node, "bigger"), limits=replace(LIMITS, open_files=99))
    assert await node.pool.hand_over(RuntimeName.ONNX_CPU, other_limits) is None
    two_gpus = replace(job_spec(node, "two-gpus"), gpu_uuids=["GPU-a", "GPU-b"])
    assert await node.pool.hand_over(RuntimeName.ONNX_CUDA, two_gpus) is None
    catboost = job_spec(node, "catboost")
    assert await node.pool.hand_over(RuntimeName.CATBOOST_CPU, catboost) is None
    assert len(node.pool.idle[CPU]) == 1  # none was used up


async def test_closing_the_pool_kills_the_waiting_processes(node: Node) -> None:
    await warm_ready(node.pool)
    warm = node.pool.idle[CPU][0]
    runtime = runtime_process(warm.process)
    await node.pool.close()
    assert warm.process.exited
    assert not runtime.is_running() or runtime.status() == psutil.STATUS_ZOMBIE
    assert list(node.pool.warm_dir.iterdir()) == []


def test_a_node_keeps_cpu_jobs_and_each_gpu_warm() -> None:
    keys = node_keys([RuntimeName.ONNX_CPU, RuntimeName.ONNX_CUDA], ["GPU-a", "GPU-b"])
    assert keys == [
        CPU,
        WarmKey(RuntimeName.ONNX_CUDA, ("GPU-a",)),
        WarmKey(RuntimeName.ONNX_CUDA, ("GPU-b",)),
    ]
    assert node_keys([RuntimeName.CATBOOST_CPU], []) == []


# Isolation: the warm process itself, seen from the host through /proc.


async def test_a_warm_bwrap_sandbox_has_no_network_and_no_host_files(
    bwrap: BwrapSandbox,  # noqa: F811 - the fixture
    host: Host,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    warm_dir = host.root / "warm"
    pool = WarmPool(LimitedSandbox(bwrap, LIMITS), warm_dir=warm_dir, limits=LIMITS, threads=1)
    pool.fill([CPU])
    try:
        await warm_ready(pool)
        warm = pool.idle[CPU][0]
        runtime = runtime_process(warm.process)
        root = Path(f"/proc/{runtime.pid}/root")
        for secret in (host.secret, host.node_key, host.blob, host.job_a, host.root):
            assert not (root / secret.relative_to("/")).exists(), secret
        assert set(os.listdir(root / "job")) <= {GO_FIFO, ".cache"}
        assert os.readlink(f"/proc/{runtime.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        assert os.readlink(f"/proc/{runtime.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
        interfaces = Path(f"/proc/{runtime.pid}/net/dev").read_text().splitlines()[2:]
        assert [line.split(":")[0].strip() for line in interfaces] == ["lo"]
        if bwrap.user_namespace:
            assert Path(f"/proc/{runtime.pid}/uid_map").read_text().split()[0] == "65534"
        environment = Path(f"/proc/{runtime.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=" in environment  # no GPU for a CPU job
    finally:
        await pool.close()


# Through a real agent: timeout and cancel of a job in a warm sandbox.


@pytest.mark.slow
async def test_an_agent_runs_jobs_in_warm_sandboxes_and_kills_them_on_timeout_and_cancel(
    live: Live,
) -> None:
    agent = live.agent(env={"GPUSHARE_AGENT_WARM_SANDBOXES": "1"})
    digits = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    inputs = await live.upload(DIGITS_INPUTS.read_bytes(), "inputs")
    first = await live.invoke(model_url=digits, inputs_url=inputs)
    assert (await live.finished(first))["status"] == "done"
    await asyncio.sleep(2.0)  # the pool refills
    second = await live.invoke(model_url=digits, inputs_url=inputs)
    assert (await live.finished(second))["status"] == "done"
    assert f"invoke {second}: runs in a warm sandbox" in agent.log

    slow = await live.upload(slow_model(100_000_000), "model")
    await asyncio.sleep(2.0)
    timed_out = await live.invoke(model_url=slow, timeout_sec=3)
    state = await live.finished(timed_out, timeout=60)
    assert state["status"] == "timeout" and state["error"]["code"] == "TIMEOUT"
    assert f"invoke {timed_out}: runs in a warm sandbox" in agent.log

    await asyncio.sleep(2.0)
    canceled = await live.invoke(model_url=slow)
    await live.wait_for(canceled, lambda s: s["status"] == "running")
    await asyncio.sleep(1.0)
    response = await live.http.post(
        f"/v1/gpu/invokes/{canceled}/cancel", headers=live.tenant_headers
    )
    assert response.status_code == 200
    assert (await live.finished(canceled, timeout=30))["status"] == "canceled"
    assert f"invoke {canceled}: runs in a warm sandbox" in agent.log


async def test_a_kind_whose_job_finds_no_sandbox_ready_keeps_one_more(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    jobs, cache = tmp_path / "jobs", tmp_path / "cache"
    jobs.mkdir(mode=0o700)
    cache.mkdir()
    shutil.copyfile(DIGITS_MODEL, cache / "model")
    shutil.copyfile(DIGITS_INPUTS, cache / "inputs")
    pool = WarmPool(sandbox, warm_dir=tmp_path / "warm", limits=LIMITS, threads=1, size=2)
    node = Node(jobs, cache, sandbox, pool)
    try:
        pool.fill([CPU])
        process, _ = await hand_over(node, job_spec(node, "first"))  # found one ready
        assert pool.wanted.get(CPU, 1) == 1
        # A second job while the first runs: its successor starts only when it ends.
        assert await pool.hand_over(RuntimeName.ONNX_CPU, job_spec(node, "second")) is None
        assert pool.wanted[CPU] == 2
        assert (await finish(process))[0] == 0

        await warm_ready(pool, count=2)  # two wait now, each for a job of its own
        processes = [warm.process for warm in pool.idle[CPU]]
        assert len(processes) == 2 and processes[0] is not processes[1]
    finally:
        await pool.close()
