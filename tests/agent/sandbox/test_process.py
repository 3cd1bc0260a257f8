"""The unisolated fallback still copies inputs, cleans the environment and kills whole trees."""

import asyncio
import json
import logging
import secrets
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpu_share.agent.sandbox import (
    ProcessSandbox,
    SandboxError,
    SandboxSpec,
    detect_sandbox,
)
from gpu_share.agent.sandbox.base import job_environment, status_from_wrapper


def python_job(job_dir: Path, code: str, **fields: Any) -> SandboxSpec:
    return SandboxSpec(
        argv=[sys.executable, "-c", textwrap.dedent(code)],
        job_dir=job_dir,
        inputs=fields.pop("inputs", {}),
        env=fields.pop("env", {}),
        **fields,
    )


async def run(spec: SandboxSpec) -> tuple[int, str]:
    job = await ProcessSandbox().start(spec)
    code = await asyncio.wait_for(job.wait(), 30)
    return code, (await asyncio.wait_for(job.stdout.read(), 30)).decode()


def sleepers(token: str) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["cmdline"] == ["sleep", token] and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


async def running(token: str, count: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while len(sleepers(token)) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return len(sleepers(token)) == count


async def gone(token: str, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while sleepers(token) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return not sleepers(token)


async def test_inputs_are_copies_so_the_cache_stays_intact(tmp_path: Path) -> None:
    cached = tmp_path / "cache" / "0123abcd"
    cached.parent.mkdir()
    cached.write_bytes(b"model bytes")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    code = """
    import os
    print(open("in/model.onnx", "rb").read().decode())
    os.chmod("in/model.onnx", 0o644)
    with open("in/model.onnx", "wb") as f:
        f.write(b"poisoned")
    """
    status, output = await run(python_job(job_dir, code, inputs={"model.onnx": cached}))
    assert (status, output.strip()) == (0, "model bytes")
    assert cached.read_bytes() == b"model bytes"
    copy = job_dir / "in" / "model.onnx"
    assert copy.stat().st_ino != cached.stat().st_ino and cached.stat().st_nlink == 1


async def test_environment_is_clean_and_cwd_is_the_job_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSHARE_SECRET_TEST", "agent secret")
    code = """
    import json, os
    print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}))
    """
    status, output = await run(python_job(tmp_path, code, env={"A": "1"}, gpu_uuids=["GPU-x"]))
    result = json.loads(output)
    assert status == 0
    assert "GPUSHARE_SECRET_TEST" not in result["env"]
    assert result["env"]["HOME"] == result["cwd"] == str(tmp_path.resolve())
    assert result["env"]["A"] == "1"
    assert result["env"]["CUDA_VISIBLE_DEVICES"] == result["env"]["NVIDIA_VISIBLE_DEVICES"]
    assert result["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-x"


async def test_kill_ends_the_tree_even_a_child_that_left_the_session(tmp_path: Path) -> None:
    token = str(800_000_000 + secrets.randbelow(99_999_999))
    code = f"""
    import subprocess, time
    subprocess.Popen(["sleep", "{token}"])
    subprocess.Popen(["sleep", "{token}"], start_new_session=True)
    print("ready", flush=True)
    time.sleep(1000)
    """
    job = await ProcessSandbox().start(python_job(tmp_path, code))
    assert await asyncio.wait_for(job.stdout.readline(), 30) == b"ready\n"
    assert await running(token, 2)  # Popen returns while the child may still be in exec
    job.kill()
    assert await asyncio.wait_for(job.wait(), 10) == -9
    assert await gone(token)
    job.kill()  # idempotent after exit


async def test_several_waiters_all_get_the_exit_status(tmp_path: Path) -> None:
    job = await ProcessSandbox().start(python_job(tmp_path, "import time; time.sleep(0.2)"))
    assert list(await asyncio.wait_for(asyncio.gather(job.wait(), job.wait()), 10)) == [0, 0]
    assert await job.wait() == 0


async def test_wait_ends_what_the_job_left_running(tmp_path: Path) -> None:
    token = str(700_000_000 + secrets.randbelow(99_999_999))
    code = f"""
    import subprocess
    subprocess.Popen(["sleep", "{token}"])
    """
    status, _ = await run(python_job(tmp_path, code))  # stdout reaches EOF: the orphan is gone
    assert status == 0
    assert await gone(token)


async def test_a_job_killed_by_a_signal_reports_minus_the_signal(tmp_path: Path) -> None:
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    assert (await run(python_job(tmp_path, crash)))[0] == -11
    assert (await run(python_job(tmp_path, "raise SystemExit(3)")))[0] == 3


async def test_a_missing_program_is_a_sandbox_error(tmp_path: Path) -> None:
    spec = SandboxSpec(argv=[str(tmp_path / "nope")], job_dir=tmp_path, inputs={}, env={})
    with pytest.raises(SandboxError, match="cannot start"):
        await ProcessSandbox().start(spec)


def test_environment_sets_thread_counts_and_hides_gpus_by_default(tmp_path: Path) -> None:
    spec = SandboxSpec(
        argv=["x"], job_dir=tmp_path, inputs={}, env={"CUDA_VISIBLE_DEVICES": "0"}, cpu_threads=4
    )
    env = job_environment(spec, home="/job")
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a job's env cannot widen its GPUs
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "4"
    assert env["OPENBLAS_NUM_THREADS"] == "1"  # numpy's BLAS does none of a runtime's work
    assert (env["HOME"], env["LANG"], env["PYTHONUNBUFFERED"]) == ("/job", "C.UTF-8", "1")


@pytest.mark.parametrize("env", [{"A=B": "x"}, {"": "x"}, {"A": "x\0y"}])
async def test_an_environment_that_would_smuggle_variables_is_refused(
    tmp_path: Path, env: dict[str, str]
) -> None:
    spec = SandboxSpec(argv=["true"], job_dir=tmp_path, inputs={}, env=env)
    with pytest.raises(SandboxError):
        await ProcessSandbox().start(spec)


def test_wrapper_status_maps_signal_deaths_to_negative_numbers() -> None:
    assert [status_from_wrapper(c) for c in (0, 1, 128, 137, 139, 255)] == [0, 1, 128, -9, -11, 255]


def test_explicit_process_sandbox_warns_that_jobs_are_not_isolated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        sandbox = detect_sandbox("process")
    assert sandbox.name == "process" and sandbox.isolated is False
    assert "NOT isolated" in caplog.text


def test_auto_falls_back_to_process_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # no Docker SDK
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap
    with caplog.at_level(logging.WARNING):
        sandbox = detect_sandbox("auto")
    assert isinstance(sandbox, ProcessSandbox)
    assert "NOT isolated" in caplog.text and "bubblewrap" in caplog.text


def test_an_unknown_preference_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sandbox"):
        detect_sandbox("chroot")
