"""Wake-ups for long-polls: "new work may be queued".

In one process a version counter and an event suffice. With PostgreSQL, replicas
tell each other through LISTEN/NOTIFY; the listener reconnects on its own, and
waiters never sleep longer than `max_wait` so a lost notification costs latency,
not work.
"""

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

CHANNEL = "gpushare_work"


class Notifier:
    def __init__(self, *, max_wait: float = 5.0) -> None:
        self.version = 0
        self._event = asyncio.Event()
        self._closed = False
        self.max_wait = max_wait

    def bump(self) -> None:
        self.version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, since: int, timeout: float) -> None:
        """Return when the version moves past `since`, after `timeout`, or on close."""
        if self.version != since or self._closed or timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), min(timeout, self.max_wait))

    async def publish(self) -> None:
        self.bump()

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self._closed = True
        self.bump()

    @property
    def closed(self) -> bool:
        return self._closed


class PostgresNotifier(Notifier):
    def __init__(self, database_url: str, *, max_wait: float = 5.0) -> None:
        super().__init__(max_wait=max_wait)
        self._dsn = (
            make_url(database_url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        self._listener: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._sender: asyncpg.Connection | None = None
        self._send_lock = asyncio.Lock()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name="notifier:listen")

    async def _listen_forever(self) -> None:
        delay = 0.5
        while not self._closed:
            try:
                conn = await asyncpg.connect(self._dsn)
                self._listener = conn
                await conn.add_listener(CHANNEL, self._on_notify)
                delay = 0.5
                self.bump()  # anything published while we were away
                while not conn.is_closed() and not self._closed:  # noqa: ASYNC110
                    await asyncio.sleep(1.0)  # asyncpg has no "connection lost" event
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("LISTEN connection failed (%s); retrying in %.1fs", exc, delay)
            finally:
                if self._listener is not None:
                    with contextlib.suppress(Exception):
                        await self._listener.close()
                    self._listener = None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    def _on_notify(self, *_args: Any) -> None:
        self.bump()

    async def publish(self) -> None:
        self.bump()
        try:
            async with self._send_lock:
                if self._sender is None or self._sender.is_closed():
                    self._sender = await asyncpg.connect(self._dsn)
                await self._sender.execute(f"NOTIFY {CHANNEL}")
        except Exception as exc:  # other replicas fall back to their max_wait polling
            log.warning("NOTIFY failed: %s", exc)
            self._sender = None

    async def close(self) -> None:
        await super().close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sender is not None:
            with contextlib.suppress(Exception):
                await self._sender.close()


def notifier_for(database_url: str) -> Notifier:
    if make_url(database_url).get_backend_name() == "postgresql":
        return PostgresNotifier(database_url)
    return Notifier()
