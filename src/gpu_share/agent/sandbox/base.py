"""The contract every sandbox keeps, and the pieces all three share.

A job sees one world whichever sandbox runs it: its folder is its working directory
and the only place it may write, its inputs are at `./in/<name>`, its environment
starts empty, and only its assigned GPUs are named in `CUDA_VISIBLE_DEVICES`.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpu_share.agent.sandbox.limits import JobLimits, LimitHit

NOBODY = 65534
"""uid and gid a job runs as where the sandbox can choose (bwrap, docker)."""

INSIDE_JOB_DIR = "/job"
"""Where the job folder appears inside bwrap and Docker; inputs are at `/job/in/<name>`."""

INPUTS_DIR = "in"
PRIVATE_TMP = "/tmp"  # noqa: S108 - a fresh tmpfs inside the sandbox, never the host's /tmp
MiB = 1024 * 1024
NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# One OpenBLAS thread whatever the job's share: no runtime does its work through numpy's
# BLAS (onnxruntime and CatBoost have their own pools), and OpenBLAS starts its whole
# pool when numpy is imported, ~80 ms of CPU per runtime process on 2 cores
# (bench/README.md, warm_invoke).
OPENBLAS_THREADS = "1"


class SandboxError(Exception):
    """A job could not be started in its sandbox."""


class SandboxUnavailable(SandboxError):
    """The requested kind of sandbox cannot run on this machine; the message says how to fix it."""


@dataclass(frozen=True)
class SandboxSpec:
    argv: list[str]
    job_dir: Path
    inputs: Mapping[str, Path]
    env: Mapping[str, str]
    gpu_uuids: Sequence[str] = ()
    cpu_threads: int | None = None
    limits: JobLimits | None = None  # None: not limited (see `LimitedSandbox` for defaults)


class SandboxedProcess(Protocol):
    pid: int
    stdout: asyncio.StreamReader
    limit_hit: LimitHit | None
    """Once `wait()` has returned: the limit that ended the job, if one did."""

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


class Sandbox(Protocol):
    name: str
    isolated: bool

    async def start(self, spec: SandboxSpec) -> SandboxedProcess: ...


def check_spec(spec: SandboxSpec) -> None:
    """Refuse what would let a job reach past its folder, before anything is mounted or copied.

    An input name becomes a path under `in/`, so it must be one plain component; an
    environment entry with `=` or NUL in its name would smuggle a second variable.
    """
    if not spec.argv:
        raise SandboxError("argv is empty")
    for name in spec.inputs:
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise SandboxError(f"input name {name!r} must be a plain file name")
    for key, value in spec.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise SandboxError(f"environment variable {key!r} is not a valid name or value")
    if spec.cpu_threads is not None and spec.cpu_threads < 1:
        raise SandboxError("cpu_threads must be at least 1")


def default_path() -> str:
    """The job's PATH: the agent's own Python first, so `python` is the runtime's interpreter."""
    return f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"


def job_environment(spec: SandboxSpec, *, home: str, path: str | None = None) -> dict[str, str]:
    """The whole environment of a job: nothing of the agent's own leaks in.

    The GPU variables are set last so a job's `env` cannot widen what it sees. An empty
    assignment sets `NVIDIA_VISIBLE_DEVICES=void`: images built on NVIDIA's CUDA bases
    carry `NVIDIA_VISIBLE_DEVICES=all`, which the NVIDIA container runtime would honour.
    """
    env = {
        "PATH": path or default_path(),
        "HOME": home,
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(spec.env)
    if spec.cpu_threads is not None:
        for name in THREAD_VARIABLES:
            env[name] = str(spec.cpu_threads)
    env["OPENBLAS_NUM_THREADS"] = OPENBLAS_THREADS
    visible = ",".join(spec.gpu_uuids)
    env["CUDA_VISIBLE_DEVICES"] = visible
    env["NVIDIA_VISIBLE_DEVICES"] = visible or "void"
    return env


def status_from_wrapper(code: int) -> int:
    """bwrap and Docker report a child killed by signal N as 128+N; give it back as -N.

    Every sandbox then reports a crash the way asyncio reports a killed child.
    """
    if 128 < code < 128 + signal.NSIG:
        return -(code - 128)
    return code


def nvidia_minor_numbers(gpus_dir: Path = NVIDIA_GPUS_DIR) -> dict[str, int] | None:
    """GPU UUID → N of `/dev/nvidiaN`, read from the driver's procfs; None without a driver."""
    if not gpus_dir.is_dir():
        return None
    minors: dict[str, int] = {}
    for information in sorted(gpus_dir.glob("*/information")):
        fields: dict[str, str] = {}
        for line in information.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        uuid, minor = fields.get("GPU UUID"), fields.get("Device Minor")
        if uuid and minor and minor.isdigit():
            minors[uuid] = int(minor)
    return minors
