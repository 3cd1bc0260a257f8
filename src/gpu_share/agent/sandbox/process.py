"""The fallback: a plain child process, not isolated from the host.

Used only where neither Docker nor bubblewrap works. The job still gets a clean
environment, copies of its inputs and its own session, so `kill()` ends everything it
started; it can read whatever the agent's user can, and the agent says so loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from gpu_share.agent.sandbox.base import (
    INPUTS_DIR,
    SandboxError,
    SandboxSpec,
    check_spec,
    job_environment,
    status_from_wrapper,
)

STREAM_LIMIT = 1024 * 1024
"""Longest line a reader of `stdout.readline()` can get; asyncio's default is 64 KiB."""


class SubprocessJob:
    """A job whose outermost process is our child, leading its own session and process group.

    `wrapped` is true when that child is a launcher (bwrap) that reports the job's
    death by signal N as exit code 128+N. `after_exit` runs on a thread once nothing of
    the job is left, before `wait()` returns.
    """

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        *,
        wrapped: bool = False,
        after_exit: Callable[[], None] | None = None,
    ) -> None:
        if process.stdout is None:
            raise SandboxError("the job was started without a stdout pipe")
        self.pid: int = process.pid
        self.stdout: asyncio.StreamReader = process.stdout
        self._process = process
        self._wrapped = wrapped
        self._after_exit = after_exit
        self._killed = False
        self._tree_gone = False
        self._waiting: asyncio.Future[int] | None = None
        # Opened at once, while the pid is surely still ours: it tells when the job's main
        # process exits even while something it left behind holds stdout open.
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfd before Linux 5.3
            self._pidfd = os.pidfd_open(self.pid)
            weakref.finalize(self, _close_quietly, self._pidfd)

    async def wait(self) -> int:
        # One waiting for all callers: the pidfd takes a single reader.
        if self._waiting is None:
            self._waiting = asyncio.ensure_future(self._wait())
        return await asyncio.shield(self._waiting)

    async def _wait(self) -> int:
        # A job ends when its main process does: what it left behind in its group goes too,
        # or it would hold stdout open (asyncio's wait() waits for that) and run unaccounted.
        await self._leader_exited()
        if not self._tree_gone:
            self._kill_tree()
        code = await self._process.wait()
        self._tree_gone = True
        if self._after_exit is not None:
            after_exit, self._after_exit = self._after_exit, None
            await asyncio.to_thread(after_exit)
        if self._wrapped and not self._killed:
            return status_from_wrapper(code)
        return code

    def kill(self) -> None:
        self._killed = True
        if not self._tree_gone:
            self._kill_tree()

    async def _leader_exited(self) -> None:
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

    def _kill_tree(self) -> None:
        # Descendants first, found while the leader still links them: one that called
        # setsid() has left the process group that killpg reaches.
        descendants: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            descendants = psutil.Process(self.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        for child in descendants:
            with contextlib.suppress(psutil.Error):
                child.kill()


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
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.argv,
                cwd=job_dir,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                limit=STREAM_LIMIT,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start {spec.argv[0]}: {exc}") from exc
        return SubprocessJob(process)


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
