"""A cgroup per job, where this machine lets the agent make one.

Each controller is taken from cgroup v2 where the unified hierarchy offers it, else
from its cgroup v1 hierarchy (a hybrid machine mounts both): `memory` (memory.max or
memory.limit_in_bytes, no swap), `pids` (pids.max) and `cpu` (cpu.max or the CFS
quota). Whatever no hierarchy offers is left to rlimits (see `limits.py`). A v2
cgroup is also how a job's processes are killed all at once (`cgroup.kill`), even
those that left its session.

A job's cgroup is `gpu-share/<key>.<job>` in each hierarchy, `key` naming the
agent's jobs folder, so two agents on one machine never touch each other's jobs and
an agent that comes back after `kill -9` finds its leftovers (the job's supervisor
removes them itself once it has killed the job, so there are rarely any). Making
them needs write access to the hierarchy's root (an agent running as root);
otherwise there are no cgroups and every limit is an rlimit.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu")
MOUNTINFO = Path("/proc/self/mountinfo")
TOP = "gpu-share"
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Hierarchies:
    """The cgroup mounts of this machine: the unified one, and v1 ones by controller."""

    unified: Path | None
    v1: tuple[tuple[str, Path], ...]  # (controller, mount point)

    @classmethod
    def read(cls, mountinfo: Path = MOUNTINFO) -> Hierarchies:
        unified: Path | None = None
        v1: dict[str, Path] = {}
        try:
            lines = mountinfo.read_text().splitlines()
        except OSError:
            return cls(None, ())
        for line in lines:
            # id parent major:minor root mount-point options [optional…] - fstype source super
            left, _, right = line.partition(" - ")
            fields, after = left.split(), right.split()
            if len(fields) < 5 or len(after) < 3 or fields[3] != "/":
                continue  # a bind of a subtree (inside a container): its paths mean other things
            mount_point = Path(fields[4].replace("\\040", " "))
            if after[0] == "cgroup2" and unified is None:
                unified = mount_point
            elif after[0] == "cgroup":
                options = set(after[2].split(","))
                for controller in CONTROLLERS:
                    if controller in options:
                        v1.setdefault(controller, mount_point)
        return cls(unified, tuple(v1.items()))


@dataclass(frozen=True)
class AgentCgroups:
    """Where this agent makes its jobs' cgroups, and what they control."""

    unified: Path | None  # <v2 mount>/gpu-share, controllers enabled for its children
    unified_controllers: frozenset[str]
    v1: dict[str, Path]  # controller → <v1 mount>/gpu-share
    prefix: str  # "<key>.": this agent's jobs among all agents' in gpu-share/

    @property
    def controllers(self) -> frozenset[str]:
        return self.unified_controllers | frozenset(self.v1)

    def create(
        self,
        name: str,
        *,
        memory_bytes: int | None,
        processes: int | None,
        cpus: float | None,
    ) -> JobCgroup:
        """A fresh cgroup for one job with its limits written; raises OSError."""
        name = self.prefix + name
        job = JobCgroup()
        try:
            if self.unified is not None:
                job.unified = _fresh(self.unified / name)
                job.folders.append(job.unified)
                written = self._write_v2(job.unified, memory_bytes, processes, cpus)
                job.controlled |= written
            for controller, parent in self.v1.items():
                limit = {"memory": memory_bytes, "pids": processes, "cpu": cpus}[controller]
                if limit is None:
                    continue
                folder = _fresh(parent / name)
                job.folders.append(folder)
                _write_v1(folder, controller, limit)
                job.controlled.add(controller)
                job.v1[controller] = folder
        except OSError:
            job.remove()
            raise
        return job

    def _write_v2(
        self, folder: Path, memory_bytes: int | None, processes: int | None, cpus: float | None
    ) -> set[str]:
        written: set[str] = set()
        if memory_bytes is not None and "memory" in self.unified_controllers:
            _write(folder / "memory.max", str(memory_bytes))
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to cap
                _write(folder / "memory.swap.max", "0")
            with contextlib.suppress(FileNotFoundError):  # before 4.19: only the biggest dies
                _write(folder / "memory.oom.group", "1")
            written.add("memory")
        if processes is not None and "pids" in self.unified_controllers:
            _write(folder / "pids.max", str(processes))
            written.add("pids")
        if cpus is not None and "cpu" in self.unified_controllers:
            _write(folder / "cpu.max", f"{_quota_us(cpus)} {CPU_PERIOD_US}")
            written.add("cpu")
        return written

    def remove_leftovers(self) -> int:
        """Kill and remove every job cgroup an earlier run of this agent left."""
        removed = 0
        for parent in {self.unified, *self.v1.values()} - {None}:
            assert parent is not None
            for folder in sorted(parent.glob(f"{self.prefix}*")):
                if folder.is_dir():
                    removed += JobCgroup(folders=[folder]).remove()
        return removed


@dataclass
class JobCgroup:
    """One job's cgroup in each hierarchy it uses; its processes join through `procs_files`."""

    folders: list[Path] = field(default_factory=list)
    unified: Path | None = None
    v1: dict[str, Path] = field(default_factory=dict)
    controlled: set[str] = field(default_factory=set)

    @property
    def procs_files(self) -> list[str]:
        return [str(folder / "cgroup.procs") for folder in self.folders]

    @property
    def kill_file(self) -> str | None:
        """The v2 `cgroup.kill` that ends the whole job at once (None before Linux 5.14)."""
        for folder in self.folders:
            if (folder / "cgroup.kill").exists():
                return str(folder / "cgroup.kill")
        return None

    @property
    def event_counters(self) -> list[tuple[str, str, str]]:
        """(limit, events file, counter) that count a limit enforced: for the supervisor,
        which reads them before it removes the cgroup."""
        counters: list[tuple[str, str, str]] = []
        if "memory" in self.v1:
            counters.append(("memory", str(self.v1["memory"] / "memory.oom_control"), "oom_kill"))
        elif self.unified is not None and "memory" in self.controlled:
            events = str(self.unified / "memory.events")
            counters += [("memory", events, "oom_kill"), ("memory", events, "oom_group_kill")]
        folder = self.v1.get("pids") or (self.unified if "pids" in self.controlled else None)
        if folder is not None:
            counters.append(("processes", str(folder / "pids.events"), "max"))
        return counters

    def memory_exceeded(self) -> bool:
        """Whether the kernel killed a process of the job for going past memory.max."""
        if self.unified is not None and "memory" in self.controlled and "memory" not in self.v1:
            events = _counters(self.unified / "memory.events")
            return events.get("oom_kill", 0) > 0 or events.get("oom_group_kill", 0) > 0
        if "memory" in self.v1:
            return _counters(self.v1["memory"] / "memory.oom_control").get("oom_kill", 0) > 0
        return False

    def processes_exceeded(self) -> bool:
        """Whether a fork or a new thread was refused at pids.max."""
        folder = self.v1.get("pids") or (self.unified if "pids" in self.controlled else None)
        return folder is not None and _counters(folder / "pids.events").get("max", 0) > 0

    def kill(self) -> None:
        """SIGKILL every process in the job's cgroups."""
        if (kill_file := self.kill_file) is not None:
            with contextlib.suppress(OSError):
                _write(Path(kill_file), "1")
        for folder in self.folders:
            for pid in _pids(folder):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def remove(self, *, patience: float = 5.0) -> bool:
        """Kill what is left and remove the folders; False if one is still busy."""
        deadline = time.monotonic() + patience
        for folder in reversed(self.folders):
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: processes still dying
                    if time.monotonic() > deadline:
                        log.warning("cgroup %s is still busy; left for the next start", folder)
                        return False
                    self.kill()
                    time.sleep(0.02)
        return True


def agent_cgroups(jobs_dir: Path, *, hierarchies: Hierarchies | None = None) -> AgentCgroups | None:
    """Where this agent makes its jobs' cgroups, made (and their controllers enabled) if
    need be; None where it cannot make cgroups (not root, a read-only /sys/fs/cgroup).

    Looked up again for each job, which costs a few small reads and writes: a folder
    someone removed meanwhile is simply made again.
    """
    hierarchies = hierarchies or Hierarchies.read()
    prefix = hashlib.sha256(str(jobs_dir.resolve()).encode()).hexdigest()[:16] + "."
    unified, unified_controllers = _unified_parent(hierarchies.unified)
    v1: dict[str, Path] = {}
    for controller, mount in hierarchies.v1:
        if controller in unified_controllers:
            continue
        try:
            v1[controller] = _folder(mount / TOP)
        except OSError as exc:
            log.info("cgroup v1 %s: cannot make job cgroups (%s)", controller, exc)
    if unified is None and not v1:
        return None
    return AgentCgroups(unified, frozenset(unified_controllers), v1, prefix)


def _unified_parent(mount: Path | None) -> tuple[Path | None, set[str]]:
    if mount is None:
        return None, set()
    try:
        available = set(_read(mount / "cgroup.controllers").split()) & set(CONTROLLERS)
        top = _folder(mount / TOP)
    except OSError as exc:
        log.info("cgroup v2: cannot make job cgroups (%s)", exc)
        return None, set()
    enabled = set(available)
    for folder in (mount, top):
        enabled = _enable(folder, enabled)
    return top, enabled


def _enable(folder: Path, controllers: set[str]) -> set[str]:
    """Enable `controllers` for the children of `folder`; returns those that are."""
    control = folder / "cgroup.subtree_control"
    for controller in sorted(controllers):
        with contextlib.suppress(OSError):  # EBUSY: the folder holds processes; ENOENT: gone
            _write(control, f"+{controller}")
    try:
        return controllers & set(_read(control).split())
    except OSError:
        return set()


def _write_v1(folder: Path, controller: str, limit: float) -> None:
    if controller == "memory":
        _write(folder / "memory.limit_in_bytes", str(int(limit)))
        with contextlib.suppress(OSError):  # without swap accounting there is nothing to cap
            _write(folder / "memory.memsw.limit_in_bytes", str(int(limit)))
    elif controller == "pids":
        _write(folder / "pids.max", str(int(limit)))
    else:
        _write(folder / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(folder / "cpu.cfs_quota_us", str(_quota_us(limit)))


def _quota_us(cpus: float) -> int:
    return max(1000, round(cpus * CPU_PERIOD_US))


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fresh(path: Path) -> Path:
    """A new, empty cgroup; one left by an earlier job of the same name is removed first."""
    if path.is_dir():
        JobCgroup(folders=[path]).remove()
    path.mkdir()
    return path


def _write(path: Path, text: str) -> None:
    # cgroup files take one write each; open without O_CREAT so a typo cannot make a file.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    return path.read_text()


def _counters(path: Path) -> dict[str, int]:
    counters: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if value.strip().isdigit():
                counters[name] = int(value)
    return counters


def _pids(folder: Path) -> list[int]:
    try:
        return [int(line) for line in _read(folder / "cgroup.procs").split()]
    except (OSError, ValueError):
        return []
