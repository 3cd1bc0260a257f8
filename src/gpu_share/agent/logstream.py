"""Ships a job's log to the coordinator in batches while it runs, and hears back verdicts."""

import asyncio
import contextlib
import logging
import time

from gpu_share.agent.client import CoordinatorClient, StaleLease
from gpu_share.protocol.agent import MAX_LOG_APPEND, LeaseVerdict

log = logging.getLogger(__name__)

MAX_BATCH = 64 * 1024


class LogStream:
    def __init__(
        self,
        client: CoordinatorClient,
        invoke_id: str,
        lease_token: str,
        *,
        flush_interval: float,
        canceled: asyncio.Event,
        dropped: asyncio.Event,
        preempted: asyncio.Event | None = None,
    ) -> None:
        self._client = client
        self._invoke_id = invoke_id
        self._lease_token = lease_token
        self._interval = flush_interval
        self._canceled = canceled
        self._dropped = dropped
        self._preempted = preempted
        self._pieces: list[str] = []
        self._size = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def write(self, text: str) -> None:
        self._pieces.append(text)
        self._size += len(text)
        if self._size >= MAX_BATCH:
            self._wake.set()

    def line(self, text: str) -> None:
        """An agent line, marked as such and timestamped."""
        self.write(f"[agent {time.strftime('%H:%M:%S')}] {text}\n")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"logs:{self._invoke_id}")

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Ship everything pending, in requests of at most `MAX_LOG_APPEND` characters."""
        async with self._lock:
            while self._pieces and not self._dropped.is_set():
                pending = "".join(self._pieces)
                text, rest = pending[:MAX_LOG_APPEND], pending[MAX_LOG_APPEND:]
                self._pieces, self._size = ([rest] if rest else []), len(rest)
                try:
                    verdict = await self._client.append_logs(
                        self._invoke_id, self._lease_token, text
                    )
                except StaleLease:
                    self._dropped.set()
                    return
                except Exception as exc:  # the coordinator is away: keep the text for next time
                    log.debug("log upload failed (%s); will retry", exc)
                    self._pieces.insert(0, text)
                    self._size += len(text)
                    return
                if verdict is LeaseVerdict.CANCEL:
                    self._canceled.set()
                elif verdict is LeaseVerdict.DROP:
                    self._dropped.set()
                elif verdict is LeaseVerdict.PREEMPT and self._preempted is not None:
                    self._preempted.set()

    async def stop(self) -> None:
        """Stop shipping in the background; what is pending stays for `flush` or
        `remainder`."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def remainder(self) -> str:
        """The text not shipped yet, taken to travel with the result report (shipped
        first when it is more than one report may carry)."""
        if self._size > MAX_BATCH:
            await self.flush()
        async with self._lock:
            if self._dropped.is_set():
                return ""
            text, self._pieces, self._size = "".join(self._pieces), [], 0
        if len(text) > MAX_LOG_APPEND:  # the coordinator was away for all of it
            cut = "[agent] earlier log text was lost: the coordinator could not be reached\n"
            text = cut + text[-(MAX_LOG_APPEND - len(cut)) :]
        return text
