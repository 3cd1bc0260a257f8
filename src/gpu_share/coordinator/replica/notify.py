"""Wake-ups for long-polls, on two channels: "new work may be queued" (agents' leases)
and "an invoke may have finished" (tenants' `GET …?wait=N`).

In one process a version counter and an event per channel suffice. A publish may name
a key (the invoke that finished): then only those watching that key wake, so a result
costs one read by the tenant waiting for it rather than one by every waiting tenant; a
publish without a key wakes everyone on the channel. With PostgreSQL, replicas tell
each other through LISTEN/NOTIFY (the key as payload); the listener reconnects on its
own, and waiters never sleep longer than `max_wait`, so a lost notification costs
latency, not work: a woken waiter always re-reads the database.

Every job publishes twice (its submit on WORK, its verdict on FINISHED). Those two ride
in the statement that commits them (`in_statement`: PostgreSQL delivers a NOTIFY at its
transaction's commit, and never for one rolled back), so they cost no round trip of
their own; the code that committed then wakes this replica's waiters (`told_by_commit`).
Colder paths `publish` on a connection of the notifier's own. Either way a replica
ignores its own NOTIFYs when they come back: they come from backends it knows (its
pool's, `Database.backend_pids`, and its sender's).
"""

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Set
from enum import StrEnum
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from gpu_share.backoff import Backoff

log = logging.getLogger(__name__)


class Channel(StrEnum):
    WORK = "gpushare_work"
    FINISHED = "gpushare_finished"


class _Signal:
    def __init__(self) -> None:
        self.version = 0
        self.event = asyncio.Event()
        self.settled_at = -1
        """The newest version after which a waiter found nothing pending at all
        (`settle`)."""

    def bump(self) -> None:
        self.version += 1
        event, self.event = self.event, asyncio.Event()
        event.set()


class Notifier:
    def __init__(self, *, max_wait: float = 5.0) -> None:
        self._signals = {channel: _Signal() for channel in Channel}
        self._watchers: dict[tuple[Channel, str], set[asyncio.Event]] = {}
        self._closed = False
        self.max_wait = max_wait

    def version(self, channel: Channel) -> int:
        return self._signals[channel].version

    def settle(self, channel: Channel, version: int) -> None:
        """A waiter that read `version` before looking found nothing pending at all: the
        waiters a wake-up at that version roused need not look again (`settled`).
        Anything that becomes pending later is published, which moves the version on."""
        signal = self._signals[channel]
        signal.settled_at = max(signal.settled_at, version)

    def settled(self, channel: Channel, version: int) -> bool:
        """Whether a waiter found nothing pending after `version` was published (`settle`):
        one wake-up of every waiter then costs one look, not one a waiter."""
        return self._signals[channel].settled_at >= version

    def bump(self, channel: Channel, key: str | None = None) -> None:
        """Wake the watchers of `key` on the channel, or, without a key, every waiter."""
        if key is not None:
            for event in self._watchers.get((channel, key), ()):
                event.set()
            return
        self._signals[channel].bump()
        for (watched, _), events in self._watchers.items():
            if watched is channel:
                for event in events:
                    event.set()

    @contextlib.contextmanager
    def watch(self, channel: Channel, key: str) -> Iterator[asyncio.Event]:
        """An event set when `key` is published on the channel (or the channel is bumped
        for all, or the notifier closes). Watch before reading what it guards, and clear
        it before each read: nothing published in between is missed."""
        event = asyncio.Event()
        if self._closed:
            event.set()
        watchers = self._watchers.setdefault((channel, key), set())
        watchers.add(event)
        try:
            yield event
        finally:
            watchers.discard(event)
            if not watchers and self._watchers.get((channel, key)) is watchers:
                del self._watchers[(channel, key)]

    async def wait_watched(self, event: asyncio.Event, timeout: float) -> None:
        """Return when `event` (from `watch`, or a channel's) is set, after `timeout`, or
        `max_wait` at most."""
        if event.is_set() or timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), min(timeout, self.max_wait))

    async def wait(self, channel: Channel, since: int, timeout: float) -> None:
        """Return when the channel's version moves past `since`, after `timeout`, or on close."""
        signal = self._signals[channel]
        if signal.version != since or self._closed:
            return
        await self.wait_watched(signal.event, timeout)

    async def publish(self, channel: Channel, key: str | None = None) -> None:
        self.bump(channel, key)

    def told_by_commit(self, channel: Channel, key: str | None = None) -> None:
        """A committed statement published this (`in_statement`): the other replicas hear
        it from the database; this one's waiters are woken here."""
        self.bump(channel, key)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self._closed = True
        for channel in Channel:
            self.bump(channel)

    @property
    def closed(self) -> bool:
        return self._closed


class PostgresNotifier(Notifier):
    def __init__(
        self,
        database_url: str,
        *,
        max_wait: float = 5.0,
        own_backends: Set[int] = frozenset(),
    ) -> None:
        """`own_backends`: the backend pids of this replica's pooled connections, kept
        current by its `Database`: NOTIFYs from them are this replica's own."""
        super().__init__(max_wait=max_wait)
        self._own_backends = own_backends
        self._dsn = (
            make_url(database_url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        self._listener: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._sender: asyncpg.Connection | None = None
        self._sender_pid: int | None = None
        """The backend our NOTIFYs come from: hearing them back would wake every waiter
        here a second time (an idle long-poll re-reads the queue on each wake-up)."""
        self._send_lock = asyncio.Lock()
        self._stop = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name="notifier:listen")

    async def _listen_forever(self) -> None:
        backoff = Backoff(first=0.5, cap=10.0)
        while not self._closed:
            try:
                conn = await asyncpg.connect(self._dsn)
                self._listener = conn
                for channel in Channel:
                    await conn.add_listener(channel.value, self._on_notify)
                backoff.reset()
                for channel in Channel:
                    self.bump(channel)  # anything published while we were away
                while not conn.is_closed() and not self._closed:  # noqa: ASYNC110
                    await asyncio.sleep(1.0)  # asyncpg has no "connection lost" event
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "LISTEN connection failed (%s); retrying in %.1fs", exc, backoff.upcoming
                )
            finally:
                if self._listener is not None:
                    with contextlib.suppress(Exception):
                        await self._listener.close()
                    self._listener = None
            await backoff.sleep(self._stop)

    def _on_notify(self, _conn: Any, pid: int, channel: str, payload: str) -> None:
        if pid == self._sender_pid or pid in self._own_backends:
            return  # this replica's own, whose waiters were woken here already
        with contextlib.suppress(ValueError):
            self.bump(Channel(channel), payload or None)

    async def publish(self, channel: Channel, key: str | None = None) -> None:
        self.bump(channel, key)
        try:
            async with self._send_lock:
                if self._sender is None or self._sender.is_closed():
                    self._sender = await asyncpg.connect(self._dsn)
                    self._sender_pid = self._sender.get_server_pid()
                await self._sender.execute("SELECT pg_notify($1, $2)", channel.value, key or "")
        except Exception as exc:  # other replicas fall back to their max_wait polling
            log.warning("NOTIFY failed: %s", exc)
            self._sender = None

    async def close(self) -> None:
        await super().close()
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sender is not None:
            with contextlib.suppress(Exception):
                await self._sender.close()


def notifier_for(database_url: str, own_backends: Set[int] = frozenset()) -> Notifier:
    if make_url(database_url).get_backend_name() == "postgresql":
        return PostgresNotifier(database_url, own_backends=own_backends)
    return Notifier()


def in_statement(channel: Channel, key_sql: str = "''") -> str:
    """The SQL expression that publishes on `channel` when its statement's transaction
    commits (PostgreSQL's `pg_notify`), for a `SELECT` list; `key_sql` is an SQL
    expression for the key (a column), or the empty key (wakes every waiter). The code
    that commits it calls `told_by_commit` after."""
    return f"pg_notify('{channel.value}', {key_sql})"
