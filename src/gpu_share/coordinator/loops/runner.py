"""Runs each background job on its interval, with jitter, forever, surviving its errors.

Jobs must be safe to run concurrently on several replicas (they claim rows with
guarded updates), so no leader election is needed.
"""

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpu_share.coordinator.replica.state import Replica

log = logging.getLogger(__name__)

Job = Callable[[Replica], Awaitable[Any]]


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    interval_sec: float
    run_once: Job
    jitter: float = 0.1
    start_after_sec: float = 0.0


class LoopRunner:
    def __init__(self, replica: Replica, jobs: list[PeriodicJob]) -> None:
        self._replica = replica
        self._jobs = jobs
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for job in self._jobs:
            self._tasks.append(asyncio.create_task(self._loop(job), name=f"loop:{job.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _loop(self, job: PeriodicJob) -> None:
        await asyncio.sleep(job.start_after_sec)
        while True:
            spread = job.interval_sec * job.jitter
            await asyncio.sleep(job.interval_sec + random.uniform(-spread, spread))  # noqa: S311
            try:
                await job.run_once(self._replica)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background job %s failed; it will run again", job.name)
