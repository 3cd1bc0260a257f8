"""Every process the bench starts, and stopping them with everything they started.

Each child gets its own session (process group), its output goes to a log file, and
stopping it sends SIGTERM, waits, then kills the group and every descendant that was
alive before the stop began: Ray's actors and Celery's pool children live in process
groups of their own, so the group alone would leave them behind.
"""

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def reap(pid: int, family: list[psutil.Process], timeout: float = 5) -> None:
    """Kill what is left of `family` (started by `pid`), by process id."""
    for child in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(family, timeout=timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class Fleet:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self.running: list[subprocess.Popen[bytes]] = []
        self.names: dict[int, str] = {}

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("wb") as log:  # this run's only
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        self.running.append(process)
        self.names[process.pid] = name
        return process

    def said(self, process: subprocess.Popen[bytes], line: str) -> bool:
        """Whether the process printed `line` (a whole line); exits if it died first."""
        name = self.names[process.pid]
        if process.poll() is not None:
            raise SystemExit(f"{name} exited with {process.returncode}: see {name}.log")
        return line in (self.logs / f"{name}.log").read_text(errors="replace").splitlines()

    def stop(self, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
        if process not in self.running:
            return
        self.running.remove(process)
        family = descendants(process.pid)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        reap(process.pid, [p for p in family if p.is_running()])

    def stop_all(self) -> None:
        for process in reversed(list(self.running)):
            self.stop(process)
