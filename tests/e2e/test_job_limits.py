"""Limits end to end: a real coordinator, real agent processes, real runtimes in bwrap.

A job past its memory fails with RESOURCE_LIMIT naming the limit and the agent runs
the next job; outputs or a checkpoint the tenant's quota cannot hold are refused
with QUOTA_EXCEEDED (the invoke) or a line in the log (the training goes on); an
agent killed with -9 takes its job with it and clears the job's folder on return.
"""

import asyncio
import contextlib
import io
import json
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from onnx import TensorProto, helper

from gpu_share.coordinator.core.settings import Settings
from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.live import Live
from gpu_share.testing.models import slow_model
from tests.agent.runtimes.test_npz import inflating_npz

# One database: the agent enforces these limits; the coordinator's side is the
# same on every database.
pytestmark = [pytest.mark.slow, pytest.mark.one_database]

MiB = 1024 * 1024


def zeros_model() -> bytes:
    """y = zeros(shape): as much memory, and output, as the inputs ask for."""
    value = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], value=value)],
        "zeros",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def shape(elements: int) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, shape=np.array([elements], dtype=np.int64))
    return buffer.getvalue()


async def test_a_job_past_its_memory_fails_naming_the_limit_and_the_agent_goes_on(
    live: Live,
) -> None:
    live.agent(env={"GPUSHARE_AGENT_JOB_MEMORY_BYTES": str(256 * MiB)})
    model_url = await live.upload(zeros_model(), "model")
    two_gib = await live.upload(shape(512 * MiB), "inputs")  # float32: 2 GiB
    state = await live.finished(await live.invoke(model_url=model_url, inputs_url=two_gib))
    assert state["status"] == "failed", state
    assert state["error"]["code"] == "RESOURCE_LIMIT"
    assert "the job used more than its 256 MiB of memory" in state["error"]["message"]
    assert "limits: 256 MiB memory" in await live.logs(state["id"])

    digits = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    inputs = await live.upload(DIGITS_INPUTS.read_bytes(), "inputs")
    after = await live.finished(await live.invoke(model_url=digits, inputs_url=inputs))
    assert after["status"] == "done", after


async def test_a_3_mib_npz_inflating_to_3_gib_fails_fast_and_the_agent_stays_small(
    live: Live, tmp_path: Path
) -> None:
    """Jobs here may use 16 GiB, so MAX_INPUTS_EXPANDED_BYTES (2 GiB) is what refuses the
    3 GiB: from the archive's headers, before any array is inflated. RSS is sampled every
    20 ms over the agent and every process under it: a loose bound, not a measurement."""
    agent = live.agent(env={"GPUSHARE_AGENT_JOB_MEMORY_BYTES": str(16 * 1024 * MiB)})
    bomb = inflating_npz(tmp_path / "bomb.npz", shape=(3 * 1024 * MiB // 8,)).read_bytes()
    assert len(bomb) < 4 * MiB
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    invoke_id = await live.invoke(model_url=model_url, inputs_url=await live.upload(bomb, "inputs"))
    tree = psutil.Process(agent.process.pid)
    peak = 0
    for _ in range(3000):
        with contextlib.suppress(psutil.Error):
            for process in [tree, *tree.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    peak = max(peak, process.memory_info().rss)
        if (await live.get(invoke_id))["status"] in ("done", "failed"):
            break
        await asyncio.sleep(0.02)
    state = await live.finished(invoke_id)
    assert state["status"] == "failed", state
    assert state["error"]["code"] == "RESOURCE_LIMIT"
    message = state["error"]["message"]
    assert "the inputs NPZ expands to 3072 MiB, more than the 2048 MiB" in message, message
    assert "MAX_INPUTS_EXPANDED_BYTES" in message
    assert peak < 500 * MiB, f"a process of the agent peaked at {peak / MiB:.0f} MiB of RSS"


async def test_outputs_the_tenants_quota_cannot_hold_fail_with_quota_exceeded(
    live: Live, settings: Settings
) -> None:
    settings.tenant_quota_bytes = 64 * 1024
    settings.inline_output_limit_bytes = 1024
    live.agent()
    model_url = await live.upload(zeros_model(), "model")
    inputs_url = await live.upload(shape(256 * 1024), "inputs")  # 1 MiB of outputs
    state = await live.finished(await live.invoke(model_url=model_url, inputs_url=inputs_url))
    assert state["status"] == "failed", state
    assert state["error"]["code"] == "QUOTA_EXCEEDED"
    message = state["error"]["message"]
    assert "could not be stored" in message and "delete old artifacts" in message
    assert state["result"]["metrics"]["compute_ms"] is not None  # it ran; only storing failed


async def test_a_refused_checkpoint_is_logged_and_the_training_goes_on(
    live: Live, settings: Settings
) -> None:
    x = np.random.default_rng(3).standard_normal((400, 8))
    buffer = io.BytesIO()
    np.savez(buffer, X=x, y=x @ np.arange(8.0))
    inputs = buffer.getvalue()
    config = json.dumps({"task": "regression", "iterations": 200, "depth": 6}).encode()
    settings.tenant_quota_bytes = len(inputs) + len(config) + 4096  # no room for a snapshot
    live.agent(env={"GPUSHARE_AGENT_CHECKPOINT_INTERVAL_SEC": "1"})
    config_url = await live.upload(config, "config")
    inputs_url = await live.upload(inputs, "inputs")
    invoke_id = await live.invoke(
        runtime="catboost_cpu", model_url=config_url, inputs_url=inputs_url, timeout_sec=300
    )
    state = await live.finished(invoke_id, timeout=120)
    assert state["status"] == "done", state
    logs = await live.logs(invoke_id)
    assert "snapshot was not saved, your artifact storage is full" in logs
    assert "training carries on without it" in logs


async def test_kill_9_of_the_agent_ends_its_job_and_its_return_clears_the_folder(
    live: Live,
) -> None:
    first = live.agent("a", sandbox="process")  # the sandbox that once left jobs running
    model_url = await live.upload(slow_model(100_000_000), "model")
    invoke_id = await live.invoke(model_url=model_url, timeout_sec=600)
    await live.wait_for(invoke_id, lambda s: s["status"] == "running")
    jobs_dir = first.data_dir / "jobs"
    runtime = await job_process(jobs_dir)
    first.kill()
    assert await ended(runtime)

    assert (jobs_dir / f"{invoke_id}-1").exists()  # what the killed attempt left
    again = live.agent("a", sandbox="process")  # the same data directory
    deadline = time.monotonic() + 60
    while "left by an earlier run" not in again.log and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert "removed 2 job folder(s) left by an earlier run" in again.log
    # Gone, though the coordinator may requeue the invoke here meanwhile (attempt 2).
    assert not (jobs_dir / f"{invoke_id}-1").exists()
    assert not (jobs_dir / f"{invoke_id}-1.staging").exists()


async def job_process(jobs_dir: Path) -> psutil.Process:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline", "cwd"]):
            cmdline = process.info["cmdline"] or []
            if "gpu_share.agent.runtimes.onnx" in cmdline and str(jobs_dir) in (
                process.info["cwd"] or ""
            ):
                return process
        await asyncio.sleep(0.1)
    raise AssertionError(f"no runtime process runs in {jobs_dir}")


async def ended(process: psutil.Process, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        await asyncio.sleep(0.05)
    return False
