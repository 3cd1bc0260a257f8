"""A job's run (`agent/running.py`): it ends at the runtime's word that a successful verdict
is written, before the process tree's exit, and the tree is still ended and reaped before
the job's folder may go; a failure waits for the exit. The runtime here is a script of the
test's, run in the process sandbox, so that what it does after its word can be seen."""

import asyncio
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from gpu_share.agent.cache import ArtifactCache
from gpu_share.agent.client import CoordinatorClient
from gpu_share.agent.gpu import Nvml
from gpu_share.agent.jobcontext import JobContext
from gpu_share.agent.logstream import LogStream
from gpu_share.agent.running import Outcome, SandboxedRun
from gpu_share.agent.runtimes.runner import RESULT_WRITTEN_LINE
from gpu_share.agent.sandbox import ProcessSandbox, SandboxSpec
from gpu_share.agent.settings import AgentSettings
from gpu_share.netguard import SafeFetcher, UrlPolicy
from gpu_share.protocol import agent as wire
from gpu_share.protocol.runtimes import RuntimeName

GiB = 1024**3

RUNTIME = textwrap.dedent(
    """
    import os, sys, time
    from gpu_share.agent.runtimes.runner import (
        RESULT_WRITTEN_LINE, FailureCode, Metrics, Result, log, write_result,
    )
    with open("pid", "w") as pid:
        pid.write(str(os.getpid()))
    log("working")
    if sys.argv[1] == "ok":
        result = Result(ok=True, outputs="out/outputs.npz", outputs_format="npz",
                        metrics=Metrics(device="cpu", load_ms=1, compute_ms=1))
    else:
        result = Result.failure(FailureCode.RUNTIME_ERROR, "it broke")
    write_result("out", result)
    log(RESULT_WRITTEN_LINE)
    time.sleep(float(sys.argv[2]))  # what is left of it: its exit, as slow as asked
    """
)


@pytest.fixture
async def job(tmp_path: Path) -> AsyncIterator[tuple[JobContext, LogStream, Path]]:
    settings = AgentSettings(server="http://127.0.0.1:9", data_dir=tmp_path / "agent")
    settings.jobs_dir.mkdir(parents=True, mode=0o700)
    async with SafeFetcher(UrlPolicy.from_strings([])) as fetcher:
        client = CoordinatorClient(settings.server)
        ctx = JobContext(
            settings,
            client,
            ArtifactCache(settings.cache_dir, GiB),
            fetcher,
            ProcessSandbox(),
            Nvml(module=None),
            threads=1,
            slots=1,
        )
        folder = settings.jobs_dir / "inv_run-1"
        (folder / "out").mkdir(parents=True)
        (folder / "runtime.py").write_text(RUNTIME)
        outcome = Outcome()
        logs = LogStream(
            client,
            "inv_run",
            "token",
            flush_interval=60.0,
            canceled=outcome.canceled,
            dropped=outcome.dropped,
        )
        yield ctx, logs, folder
        await client.aclose()


def _run(ctx: JobContext, logs: LogStream, folder: Path, timeout_sec: int = 120) -> SandboxedRun:
    lease = wire.LeasedJob(
        invoke_id="inv_run",
        lease_token="token",
        lease_expires_at=datetime.now(UTC) + timedelta(minutes=5),
        attempt=1,
        runtime=RuntimeName.ONNX_CPU,
        model=wire.ArtifactRef(url="http://127.0.0.1:9/model", platform=False, sha256=None),
        inputs=None,
        timeout_sec=timeout_sec,
        gpus=0,
        outputs_upload=None,
        inline_limit_bytes=1024,
    )
    return SandboxedRun(
        ctx, lease, [], job_dir=folder, logs=logs, outcome=Outcome(), checkpoints=None
    )


def _spec(folder: Path, verdict: str, exit_after_sec: float) -> SandboxSpec:
    argv = [sys.executable, "runtime.py", verdict, str(exit_after_sec)]
    return SandboxSpec(argv=argv, job_dir=folder, inputs={}, env={})


def _alive(folder: Path) -> bool:
    try:
        process = psutil.Process(int((folder / "pid").read_text()))
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


async def test_a_run_ends_at_a_success_written_and_its_process_is_ended_before_the_folder_goes(
    job: tuple[JobContext, LogStream, Path],
) -> None:
    ctx, logs, folder = job
    run = _run(ctx, logs, folder)
    started = time.monotonic()
    # The runtime would take a minute more to exit: the run does not wait for that.
    end = await asyncio.wait_for(run.run(_spec(folder, "ok", 60), started), 30)
    assert (end.exit_code, end.stopped, end.limit_hit) == (0, None, None)
    result = run.read_result()
    assert result is not None and result.ok
    await asyncio.wait_for(run.finished(), 30)  # killed, not waited out
    assert time.monotonic() - started < 45
    assert not _alive(folder)
    text = await logs.remainder()
    assert "working" in text
    assert RESULT_WRITTEN_LINE not in text  # the runtime's word to the agent, not a log line


async def test_a_failure_written_waits_for_the_exit(
    job: tuple[JobContext, LogStream, Path],
) -> None:
    # Its exit's limits may say more of why it failed than its verdict does.
    ctx, logs, folder = job
    run = _run(ctx, logs, folder)
    end = await asyncio.wait_for(run.run(_spec(folder, "failed", 1), time.monotonic()), 30)
    assert not _alive(folder)  # the run lasted until the process had exited
    assert (end.exit_code, end.stopped) == (0, None)
    result = run.read_result()
    assert result is not None and not result.ok


async def test_a_failure_written_then_stuck_ends_at_its_timeout(
    job: tuple[JobContext, LogStream, Path],
) -> None:
    ctx, logs, folder = job
    run = _run(ctx, logs, folder, timeout_sec=2)
    started = time.monotonic()
    end = await asyncio.wait_for(run.run(_spec(folder, "failed", 60), started), 30)
    assert end.stopped == "timeout"
    assert time.monotonic() - started < 20
    assert not _alive(folder)
