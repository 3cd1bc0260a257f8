"""What one job may use, and how each limit is enforced on this machine.

| limit | enforced by | where no cgroup offers it |
| --- | --- | --- |
| memory | cgroup `memory` (the kernel kills the job) | RLIMIT_DATA per process (allocations fail) |
| CPU | cgroup `cpu` quota (the job is throttled) | RLIMIT_CPU: cpus × timeout CPU-seconds |
| processes | cgroup `pids` (fork fails) | not limited |
| open files | RLIMIT_NOFILE | |
| disk | the agent measures the job folder and kills the job past it; RLIMIT_FSIZE per file | |
| wall time | the agent kills the job at `timeout_sec` (`running.py`) | |

The process count has no rlimit to fall back on: RLIMIT_NPROC counts every process
of the user (inside bwrap's user namespace too, the kernel also counts the agent's
user outside), and for root it is not applied at all. RLIMIT_DATA and RLIMIT_CPU
bound each process of the job, not the job as a whole; the runtimes run one process.
The address space (RLIMIT_AS) is not limited: CUDA reserves far more of it than it
ever uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gpu_share.agent import failures
from gpu_share.agent.sandbox.cgroups import AgentCgroups, JobCgroup, agent_cgroups

if TYPE_CHECKING:
    from gpu_share.agent.sandbox.base import Sandbox, SandboxedProcess, SandboxSpec

Limit = Literal["memory", "cpu", "processes", "open_files", "disk"]
SIGXCPU = 24
SIGXFSZ = 25
DISK_POLL_SEC = 1.0


@dataclass(frozen=True)
class JobLimits:
    """What one job may use; None: not limited. See `jobcontext.job_limits()` for the defaults."""

    memory_bytes: int | None = None
    cpus: float | None = None
    processes: int | None = None
    open_files: int | None = None
    disk_bytes: int | None = None
    wall_sec: float | None = None  # the job's timeout: with `cpus`, its CPU-time budget
    cgroups: bool = True  # False: rlimits only, even where the agent could make cgroups

    def for_wall_time(self, seconds: float) -> JobLimits:
        return replace(self, wall_sec=seconds)

    @property
    def cpu_seconds(self) -> int | None:
        if self.cpus is None or self.wall_sec is None:
            return None
        return math.ceil(self.cpus * self.wall_sec)

    def describe(self) -> str:
        """`2048 MiB memory, 2 CPUs, …`: the limits as a job's log shows them."""
        parts = []
        if self.memory_bytes is not None:
            parts.append(f"{failures.mib(self.memory_bytes)} memory")
        if self.cpus is not None:
            parts.append(f"{self.cpus:g} CPUs")
        if self.processes is not None:
            parts.append(f"{self.processes} processes")
        if self.open_files is not None:
            parts.append(f"{self.open_files} open files")
        if self.disk_bytes is not None:
            parts.append(f"{failures.mib(self.disk_bytes)} disk")
        if self.wall_sec is not None:
            parts.append(f"{self.wall_sec:g} s")
        return ", ".join(parts) or "none"


@dataclass(frozen=True)
class LimitHit:
    """A limit the job went past, in words for the tenant."""

    limit: Limit
    message: str


class Confinement:
    """One job's limits as applied: its cgroup (if any) and the rlimits its process takes."""

    def __init__(
        self,
        limits: JobLimits,
        *,
        name: str,
        jobs_dir: Path,
        cgroups: AgentCgroups | None = None,
    ) -> None:
        self.limits = limits
        system = cgroups if cgroups is not None else _cgroups(limits, jobs_dir)
        self.cgroup: JobCgroup | None = None
        if system is not None:
            self.cgroup = system.create(
                f"{name}.{secrets.token_hex(4)}",
                memory_bytes=limits.memory_bytes,
                processes=limits.processes,
                cpus=limits.cpus,
            )
        self.rlimits = self._rlimits(limits)

    def _rlimits(self, limits: JobLimits) -> dict[str, int]:
        controlled = self.cgroup.controlled if self.cgroup is not None else set()
        rlimits: dict[str, int] = {}
        if limits.open_files is not None:
            rlimits["RLIMIT_NOFILE"] = limits.open_files
        if limits.disk_bytes is not None:
            rlimits["RLIMIT_FSIZE"] = limits.disk_bytes
        if limits.memory_bytes is not None and "memory" not in controlled:
            rlimits["RLIMIT_DATA"] = limits.memory_bytes
        if limits.cpu_seconds is not None and "cpu" not in controlled:
            rlimits["RLIMIT_CPU"] = limits.cpu_seconds
        return rlimits

    def adopt(self, limits: JobLimits) -> dict[str, int]:
        """A process started ahead of its job (`warm.py`) takes the job's limits: they judge
        how it ends from now on. Returns the rlimits the process must lower itself to (its
        supervisor applied the others at the start); raises ValueError for a limit that
        could only be applied at the start."""
        wanted = self._rlimits(limits)
        changed = {name: value for name, value in wanted.items() if self.rlimits.get(name) != value}
        lifted = self.rlimits.keys() - wanted.keys()
        raised = [n for n, v in changed.items() if n in self.rlimits and v > self.rlimits[n]]
        if lifted or raised:
            raise ValueError(f"limits {sorted([*lifted, *raised])} cannot be widened now")
        self.limits = limits
        self.rlimits = wanted
        return changed

    @property
    def enforced(self) -> dict[str, str]:
        """Each limit and what enforces it here: for the job's log and for tests."""
        controlled = self.cgroup.controlled if self.cgroup is not None else set()
        how: dict[str, str] = {}
        for limit, controller, rlimit in (
            ("memory", "memory", "RLIMIT_DATA"),
            ("cpu", "cpu", "RLIMIT_CPU"),
            ("processes", "pids", None),
        ):
            if controller in controlled:
                how[limit] = "cgroup"
            elif rlimit in self.rlimits:
                how[limit] = "rlimit"
        if "RLIMIT_NOFILE" in self.rlimits:
            how["open_files"] = "rlimit"
        if self.limits.disk_bytes is not None:
            how["disk"] = "watch"
        return how

    def supervisor_config(self) -> dict[str, object]:
        cgroup = self.cgroup
        return {
            "cgroup_procs": cgroup.procs_files if cgroup is not None else [],
            "cgroup_kill": cgroup.kill_file if cgroup is not None else None,
            "cgroup_events": cgroup.event_counters if cgroup is not None else [],
            "rlimits": self.rlimits,
        }

    def kill(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()

    def hit(self, status: int | None, reported: list[str] | None = None) -> LimitHit | None:
        """The limit that ended the job, judged from its exit status and its cgroup's
        counters: as the supervisor `reported` them, else (the supervisor was killed)
        read from the cgroup if it is still there."""
        limits = self.limits
        cgroup = self.cgroup

        def counted(limit: str) -> bool:
            if reported is not None:
                return limit in reported
            if cgroup is None:
                return False
            return cgroup.memory_exceeded() if limit == "memory" else cgroup.processes_exceeded()

        if limits.memory_bytes is not None and counted("memory"):
            return LimitHit("memory", failures.memory_exceeded(limits.memory_bytes))
        if status == -SIGXCPU and limits.cpus is not None and limits.cpu_seconds is not None:
            return LimitHit("cpu", failures.cpu_time_exceeded(limits.cpu_seconds, limits.cpus))
        if status == -SIGXFSZ and limits.disk_bytes is not None:
            return LimitHit("disk", failures.disk_exceeded(limits.disk_bytes))
        if limits.processes is not None and counted("processes"):
            return LimitHit("processes", failures.processes_exceeded(limits.processes))
        return None

    def release(self) -> None:
        """Remove the job's cgroup if the supervisor could not; once nothing of the job runs."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None


def _cgroups(limits: JobLimits, jobs_dir: Path) -> AgentCgroups | None:
    if not limits.cgroups:
        return None
    return agent_cgroups(jobs_dir)


class DiskWatch:
    """How much a job has written to its folder since it started.

    Files present at the start (the inputs the agent put there, a restored
    checkpoint) count only by what they grew. A file counts by the larger of its
    length and the disk blocks it holds, so neither a sparse file (whose length the
    agent would copy) nor preallocated blocks slip under the limit; a file linked
    twice counts once.
    """

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        self._baseline = dict(_files(folder))

    def rebase(self, folder: Path) -> None:
        """Count from now, in `folder` (where the folder was moved): the files the agent just
        placed are the job's inputs, not its writes."""
        self.folder = folder
        self._baseline = dict(_files(folder))

    def written(self) -> int:
        total = 0
        seen: set[tuple[int, int]] = set()
        for key, size in _files(self.folder):
            if key not in seen:
                seen.add(key)
                total += max(0, size - self._baseline.get(key, 0))
        return total

    def exceeded(self) -> LimitHit | None:
        if self.written() > self.limit:
            return LimitHit("disk", failures.disk_exceeded(self.limit))
        return None


async def watch_disk(disk: DiskWatch, on_hit: Callable[[LimitHit], None]) -> None:
    """Measure the folder until it goes past its limit, then call `on_hit` once.

    A folder of very many files costs a walk each time, so it is looked at less often.
    """
    interval = DISK_POLL_SEC
    while True:
        await asyncio.sleep(interval)
        started = time.monotonic()
        hit = await asyncio.to_thread(disk.exceeded)
        interval = max(DISK_POLL_SEC, 4 * (time.monotonic() - started))
        if hit is not None:
            on_hit(hit)
            return


def _files(folder: Path) -> Iterator[tuple[tuple[int, int], int]]:
    stack = [str(folder)]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
                    yield (info.st_dev, info.st_ino), max(info.st_size, info.st_blocks * 512)


class LimitedSandbox:
    """A sandbox whose every process runs inside `limits` unless its spec brings its own:
    a job's and a session's model process alike."""

    def __init__(self, inner: Sandbox, limits: JobLimits) -> None:
        self.inner = inner
        self.limits = limits
        self.name = inner.name
        self.isolated = inner.isolated

    async def start(self, spec: SandboxSpec) -> SandboxedProcess:
        if spec.limits is None:
            spec = replace(spec, limits=self.limits)
        return await self.inner.start(spec)

    def remove_leftovers(self, jobs_dir: Path) -> None:
        remove = getattr(self.inner, "remove_leftovers", None)
        if remove is not None:
            remove(jobs_dir)
