"""`gpu-share server --workers N`: N coordinator processes sharing one listening socket.

The parent binds the socket, starts the workers (each a `gpu-share server` that inherits
the socket and serves it), and watches them. Each worker is a replica like any other: on
one PostgreSQL, its background loops safe beside the others', its sessions reached by
the others through its relay listener on loopback (`GPUSHARE_RELAY_HOST`, set here if
unset), and its metrics summed with theirs (`PROMETHEUS_MULTIPROC_DIR`, a fresh folder
made here if unset).

A worker that dies is started again; one that exits with an error within `STARTUP_SEC`
of its start (a setting, the database) stops them all with its status, as the single
process would.
Ctrl+C or SIGTERM stops every worker gracefully (a second one, at once).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from gpu_share.backoff import Backoff

log = logging.getLogger("gpu_share.server")

STARTUP_SEC = 15.0  # a worker that fails sooner failed to start: the others would too
STOP_SEC = 40.0  # how long a stopping worker may take before it is killed


class _Worker:
    def __init__(self, number: int, argv: list[str], env: dict[str, str], fd: int) -> None:
        self.number = number
        self._argv = argv
        self._env = env
        self._fd = fd
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.stopped = False  # sent SIGTERM: a second one would end it at once

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.stopped = False
        # A session of its own: a terminal's Ctrl+C reaches the parent only, which stops
        # each worker once (a second signal would end a worker at once).
        self.process = subprocess.Popen(
            self._argv, env=self._env, pass_fds=[self._fd], start_new_session=True
        )

    def stop(self, *, at_once: bool = False) -> None:
        """SIGTERM once (a graceful stop), or SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        if self.stopped and not at_once:
            return
        self.stopped = True
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL if at_once else signal.SIGTERM)


def run_workers(sock: socket.socket, count: int, log_level: str) -> int:
    sock.listen(2048)
    fd = sock.fileno()
    with _shared_metrics_folder() as env:
        env.setdefault("GPUSHARE_RELAY_HOST", "127.0.0.1")
        argv = [
            sys.executable,
            "-m",
            "gpu_share.cli.main",
            "server",
            "--log-level",
            log_level,
            "--inherit-fd",
            str(fd),
        ]
        workers = [_Worker(n, argv, env, fd) for n in range(1, count + 1)]
        stopping = threading.Event()
        received = 0

        def on_signal(signum: int, frame: object) -> None:
            nonlocal received
            received += 1
            stopping.set()
            for worker in workers:  # the second signal: at once
                worker.stop(at_once=received > 1)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for worker in workers:
                worker.start()
            log.info("started %d workers on one socket", count)
            status = _watch(workers, stopping)
        finally:
            stopping.set()
            for worker in workers:
                worker.stop()
            _wait_all(workers)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return status


def _watch(workers: list[_Worker], stopping: threading.Event) -> int:
    """Until asked to stop (0) or a worker fails to start (its status)."""
    backoff = Backoff(first=1.0, cap=30.0)
    while not stopping.wait(0.2):
        for worker in workers:
            assert worker.process is not None
            status = worker.process.poll()
            if status is None or stopping.is_set():
                continue
            # An exit status (not a signal) soon after its start: it could not start.
            if status > 0 and time.monotonic() - worker.started_at < STARTUP_SEC:
                log.error("worker %d failed to start (status %d); stopping", worker.number, status)
                return status or 1
            delay = backoff.next_delay()
            log.error(
                "worker %d exited (status %d); starting it again in %.1f s",
                worker.number,
                status,
                delay,
            )
            if stopping.wait(delay):
                break
            worker.start()
    return 0


def _wait_all(workers: list[_Worker]) -> None:
    deadline = time.monotonic() + STOP_SEC
    for worker in workers:
        if worker.process is None:
            continue
        try:
            worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("worker %d did not stop in %.0f s; killing it", worker.number, STOP_SEC)
            worker.process.kill()
            worker.process.wait()


@contextlib.contextmanager
def _shared_metrics_folder() -> Iterator[dict[str, str]]:
    """The workers' environment, with a folder for their metrics when none is named."""
    env = dict(os.environ)
    if env.get("PROMETHEUS_MULTIPROC_DIR"):
        yield env
        return
    folder = tempfile.mkdtemp(prefix="gpushare-metrics-")
    env["PROMETHEUS_MULTIPROC_DIR"] = folder
    try:
        yield env
    finally:
        shutil.rmtree(folder, ignore_errors=True)
