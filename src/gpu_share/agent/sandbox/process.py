"""The fallback: a plain child process, not isolated from the host; and how every job
process is started, this one and bwrap's alike.

The process sandbox is used only where neither Docker nor bubblewrap works. The job
still gets a clean environment, copies of its inputs, its limits and a supervisor
that ends everything it started; it can read whatever the agent's user can, and the
agent says so loudly.

Every job runs under a supervisor (`supervisor.py`): it applies the job's cgroup and
rlimits, and kills all that is left of the job when its main process ends, when the
agent says stop, or when the agent dies (even by `kill -9`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

import psutil

from gpu_share.agent.sandbox.base import (
    INPUTS_DIR,
    SandboxError,
    SandboxSpec,
    check_spec,
    job_environment,
    status_from_wrapper,
)
from gpu_share.agent.sandbox.limits import (
    Confinement,
    DiskWatch,
    JobLimits,
    LimitHit,
    watch_disk,
)

log = logging.getLogger(__name__)

STREAM_LIMIT = 1024 * 1024
"""Longest line a reader of `stdout.readline()` can get; asyncio's default is 64 KiB."""

SUPERVISOR = Path(__file__).with_name("supervisor.py")
SUPERVISOR_GRACE_SEC = 5.0

_lifeline_lock = threading.Lock()
_lifeline: tuple[int, int, int] | None = None  # (pid, read end, write end)


def lifeline() -> int:
    """The read end of a pipe whose write end this agent process holds until it dies.

    Supervisors get the read end; it reads end-of-file once the agent is gone, however
    it went. Never written to, never closed.
    """
    global _lifeline
    with _lifeline_lock:
        if _lifeline is None or _lifeline[0] != os.getpid():
            read_end, write_end = os.pipe()  # both close-on-exec: only pass_fds hands it on
            _lifeline = (os.getpid(), read_end, write_end)
        return _lifeline[1]


async def start_supervised(
    argv: Sequence[str],
    *,
    spec: SandboxSpec,
    env: Mapping[str, str],
    cwd: Path | None,
    after_exit: Callable[[Path], None] | None = None,
) -> SubprocessJob:
    """Start `argv` (the job, or bwrap wrapping it) under a supervisor with `spec.limits`."""
    limits = spec.limits or JobLimits(cgroups=False)
    job_dir = spec.job_dir.resolve()
    confinement, disk = await asyncio.to_thread(_prepare, limits, job_dir)
    status_r, status_w = os.pipe()
    config = {
        "argv": list(argv),
        "status_fd": status_w,
        "lifeline_fd": lifeline(),
        **confinement.supervisor_config(),
    }
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            str(SUPERVISOR),
            json.dumps(config),
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            limit=STREAM_LIMIT,
            pass_fds=(status_w, lifeline()),
        )
    except OSError as exc:
        os.close(status_r)
        await asyncio.to_thread(confinement.release)
        raise SandboxError(f"cannot start the job's supervisor: {exc}") from exc
    finally:
        os.close(status_w)
    report = os.fdopen(status_r, "rb")
    try:
        started = await asyncio.to_thread(report.readline)
    except BaseException:
        report.close()
        raise
    if started != b"ok\n":
        report.close()
        await process.wait()
        await asyncio.to_thread(confinement.release)
        raise SandboxError(started.decode(errors="replace") or "the job's supervisor stopped")
    return SubprocessJob(
        process,
        confinement=confinement,
        disk=disk,
        report=report,
        after_exit=after_exit,
        job_dir=job_dir,
    )


def _prepare(limits: JobLimits, job_dir: Path) -> tuple[Confinement, DiskWatch | None]:
    def confine(limits: JobLimits) -> Confinement:
        return Confinement(limits, name=job_dir.name, jobs_dir=job_dir.parent)

    try:
        confinement = confine(limits)
    except OSError as exc:
        log.warning("cannot make a cgroup for %s (%s); its limits are rlimits", job_dir, exc)
        confinement = confine(replace(limits, cgroups=False))
    disk = DiskWatch(job_dir, limits.disk_bytes) if limits.disk_bytes is not None else None
    return confinement, disk


class SubprocessJob:
    """A job under its supervisor, our child, which leads its own session.

    `wait()` returns once nothing of the job is left, with its status (a death by
    signal N as -N); `limit_hit` then says whether a limit ended it. `after_exit`
    runs on a thread at that point, before `wait()` returns, given the job's folder.
    """

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        *,
        confinement: Confinement,
        disk: DiskWatch | None = None,
        report: BinaryIO | None = None,
        after_exit: Callable[[Path], None] | None = None,
        job_dir: Path | None = None,
    ) -> None:
        """`report` is the supervisor's status pipe, past its first line."""
        if process.stdout is None:
            raise SandboxError("the job was started without a stdout pipe")
        self.pid: int = process.pid
        self.stdout: asyncio.StreamReader = process.stdout
        self.limit_hit: LimitHit | None = None
        self._process = process
        self._confinement = confinement
        self._disk = disk
        self._report = report
        self._after_exit = after_exit
        self.job_dir = job_dir
        self._killed = False
        self._gone = False
        self._waiting: asyncio.Future[int] | None = None
        self._stubborn: asyncio.TimerHandle | None = None
        # Opened at once, while the pid is surely still ours: it tells when the supervisor
        # exits even if something of the job escaped it and holds stdout open.
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfd before Linux 5.3
            self._pidfd = os.pidfd_open(self.pid)
            weakref.finalize(self, _close_quietly, self._pidfd)
        self._watching = (
            asyncio.ensure_future(watch_disk(disk, self._disk_full)) if disk is not None else None
        )

    @property
    def exited(self) -> bool:
        """Whether the job's process tree has ended (its supervisor has exited)."""
        return self._gone or self._process.returncode is not None

    def assign(self, limits: JobLimits, job_dir: Path) -> dict[str, int]:
        """A process started ahead of its job takes it (`warm.py`), once the agent has put the
        job's files in its folder and moved the folder to `job_dir`: the job's `limits` judge
        it from now on, the files count as inputs, not writes. Returns the rlimits the
        process must lower itself to."""
        lowered = self._confinement.adopt(limits)
        self.job_dir = job_dir
        if self._disk is not None:
            self._disk.rebase(job_dir)
        return lowered

    def disk_exceeded(self) -> LimitHit | None:
        """Whether the job's folder is past its disk limit now (`wait()` judges it again
        once the job has ended)."""
        return self._disk.exceeded() if self._disk is not None else None

    def _disk_full(self, hit: LimitHit) -> None:
        self.limit_hit = hit
        self.kill()

    async def wait(self) -> int:
        # One waiting for all callers: the pidfd takes a single reader.
        if self._waiting is None:
            self._waiting = asyncio.ensure_future(self._wait())
        return await asyncio.shield(self._waiting)

    async def _wait(self) -> int:
        await self._supervisor_exited()
        self._gone = True
        if self._stubborn is not None:
            self._stubborn.cancel()
        self._confinement.kill()  # nothing, unless the supervisor itself was killed
        code = status_from_wrapper(await self._process.wait())
        if self._watching is not None:
            self._watching.cancel()
        await asyncio.to_thread(self._finish, code)
        return code

    def _finish(self, code: int) -> None:
        reported = self._read_report()
        if self.limit_hit is None:
            self.limit_hit = self._confinement.hit(code, reported)
        if self.limit_hit is None and self._disk is not None:
            self.limit_hit = self._disk.exceeded()
        self._confinement.release()
        if self._after_exit is not None and self.job_dir is not None:
            after_exit, self._after_exit = self._after_exit, None
            after_exit(self.job_dir)

    def _read_report(self) -> list[str] | None:
        """The limits the supervisor found enforced; None if it said nothing (killed)."""
        if self._report is None:
            return None
        with self._report:
            line = self._report.readline()  # the supervisor has exited: at most EOF waits
        try:
            hits = json.loads(line)
        except ValueError:
            return None
        return [str(hit) for hit in hits] if isinstance(hits, list) else None

    def kill(self) -> None:
        """Kill the whole job now; `wait()` then reports -9."""
        self._killed = True
        if self._gone:
            return
        # The job's processes first, found while the supervisor still links them; then the
        # supervisor, told to sweep what is left and exit.
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
        self._confinement.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        if self._stubborn is None:
            self._stubborn = asyncio.get_running_loop().call_later(
                SUPERVISOR_GRACE_SEC, self._kill_supervisor
            )

    def _kill_supervisor(self) -> None:
        if not self._gone:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    async def _supervisor_exited(self) -> None:
        if self._pidfd is None:
            await self._process.wait()
            return
        exited = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(self._pidfd, exited.set)  # readable once the process has exited
        try:
            await exited.wait()
        finally:
            loop.remove_reader(self._pidfd)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class ProcessSandbox:
    """Runs the job as a plain child of the agent; `isolated` is False and callers must say so."""

    name = "process"
    isolated = False

    async def start(self, spec: SandboxSpec) -> SubprocessJob:
        check_spec(spec)
        job_dir = spec.job_dir.resolve()
        if not job_dir.is_dir():
            raise SandboxError(f"job folder {job_dir} does not exist")
        await asyncio.to_thread(copy_inputs, spec.inputs, job_dir / INPUTS_DIR)
        env = job_environment(spec, home=str(job_dir))
        return await start_supervised(spec.argv, spec=spec, env=env, cwd=job_dir)


def copy_inputs(inputs: Mapping[str, Path], in_dir: Path) -> None:
    """Copy, never link: a hard link would let the job rewrite the agent's cached artifact."""
    if in_dir.is_symlink():  # left by an earlier step: the copies must land in the job folder
        in_dir.unlink()
    in_dir.mkdir(exist_ok=True)
    for name, source in inputs.items():
        target = in_dir / name
        target.unlink(missing_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o444)
