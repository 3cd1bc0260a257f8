"""Wake-ups: a keyed publish wakes only the watchers of its key, on one replica and
across replicas (PostgreSQL LISTEN/NOTIFY with the key as payload)."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.replica.notify import Channel, Notifier, PostgresNotifier, in_statement


async def test_a_keyed_publish_wakes_its_watchers_only() -> None:
    notifier = Notifier()
    with (
        notifier.watch(Channel.FINISHED, "inv_a") as a,
        notifier.watch(Channel.FINISHED, "inv_b") as b,
    ):
        version = notifier.version(Channel.FINISHED)
        await notifier.publish(Channel.FINISHED, "inv_a")

        assert a.is_set() and not b.is_set()
        assert notifier.version(Channel.FINISHED) == version  # channel-wide waiters sleep on


async def test_a_publish_without_a_key_wakes_every_watcher_of_the_channel() -> None:
    notifier = Notifier()
    with (
        notifier.watch(Channel.FINISHED, "inv_a") as a,
        notifier.watch(Channel.WORK, "inv_a") as other_channel,
    ):
        await notifier.publish(Channel.FINISHED)

        assert a.is_set() and not other_channel.is_set()


async def test_a_publish_before_the_wait_is_not_missed_and_closing_wakes_all() -> None:
    notifier = Notifier(max_wait=30)
    with notifier.watch(Channel.FINISHED, "inv_a") as finished:
        finished.clear()  # as a waiter does before reading the invoke
        await notifier.publish(Channel.FINISHED, "inv_a")  # lands during the read
        await asyncio.wait_for(notifier.wait_watched(finished, 30), 1)

        finished.clear()
        await notifier.close()
        await asyncio.wait_for(notifier.wait_watched(finished, 30), 1)
    with notifier.watch(Channel.FINISHED, "inv_b") as late:
        assert late.is_set()  # a closed notifier never parks anyone


async def test_watches_leave_nothing_behind() -> None:
    notifier = Notifier()
    with notifier.watch(Channel.FINISHED, "inv_a"), notifier.watch(Channel.FINISHED, "inv_a"):
        pass
    await notifier.publish(Channel.FINISHED, "inv_a")
    assert notifier._watchers == {}


@pytest.fixture
async def replicas(db_url: str) -> AsyncIterator[tuple[PostgresNotifier, PostgresNotifier]]:
    """Two replicas' notifiers on one database: here, and there."""
    if not db_url.startswith("postgresql"):
        pytest.skip("replicas tell each other through PostgreSQL only")
    here, there = PostgresNotifier(db_url), PostgresNotifier(db_url)
    await here.start()
    await there.start()
    try:
        yield here, there
    finally:
        await here.close()
        await there.close()


async def test_a_keyed_publish_reaches_the_watcher_on_another_replica(
    replicas: tuple[PostgresNotifier, PostgresNotifier],
) -> None:
    here, there = replicas
    with (
        there.watch(Channel.FINISHED, "inv_a") as a,
        there.watch(Channel.FINISHED, "inv_b") as b,
    ):
        for _ in range(100):  # until the other replica listens (connecting wakes all)
            a.clear()
            await here.publish(Channel.FINISHED, "inv_a")
            await there.wait_watched(a, 0.1)
            if a.is_set():
                break
        a.clear()
        b.clear()
        await here.publish(Channel.FINISHED, "inv_a")
        await there.wait_watched(a, 5)

        assert a.is_set()
        assert not b.is_set()


async def test_a_replica_wakes_its_own_waiters_once_per_publish(
    replicas: tuple[PostgresNotifier, PostgresNotifier],
) -> None:
    here, there = replicas
    for sender, listener in ((here, there), (there, here)):  # until each hears the other
        for _ in range(100):  # (a listener that connects wakes all: not in the count below)
            seen = listener.version(Channel.WORK)
            await sender.publish(Channel.WORK)
            await listener.wait(Channel.WORK, seen, 0.1)
            if listener.version(Channel.WORK) != seen:
                break
    await asyncio.sleep(0.2)  # both listening: nothing of the warm-up left in flight
    mine, theirs = here.version(Channel.WORK), there.version(Channel.WORK)
    for _ in range(3):
        await here.publish(Channel.WORK)
    for _ in range(250):  # until the other replica heard all three
        if there.version(Channel.WORK) >= theirs + 3:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # our own NOTIFYs, heard back by now if they wake us
    # Each publish wakes this replica once (the publish itself, not its echo), as it
    # wakes the other: anyone else's NOTIFY on the database would reach both alike.
    assert there.version(Channel.WORK) - theirs >= 3
    assert here.version(Channel.WORK) - mine == there.version(Channel.WORK) - theirs


async def _until_listening(sender: PostgresNotifier, listener: PostgresNotifier) -> None:
    """Publish until `listener` hears `sender` (a listener that connects wakes all)."""
    for _ in range(100):
        seen = listener.version(Channel.WORK)
        await sender.publish(Channel.WORK)
        await listener.wait(Channel.WORK, seen, 0.1)
        if listener.version(Channel.WORK) != seen:
            return
    raise AssertionError("the replica never heard the other")


async def _heard_after(notifier: PostgresNotifier, since: int, count: int) -> int:
    for _ in range(250):
        if notifier.version(Channel.WORK) >= since + count:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # and anything more in flight
    return notifier.version(Channel.WORK) - since


async def test_a_notify_committed_in_a_statement_reaches_other_replicas_not_its_own(
    db_url: str,
) -> None:
    """The submit's and the verdict's NOTIFYs ride in their statements (`in_statement`),
    on the pool's connections: the other replica hears each once at the commit, none
    from a rolled-back transaction, and this replica ignores its own coming back."""
    if not db_url.startswith("postgresql"):
        pytest.skip("replicas tell each other through PostgreSQL only")
    db = Database(db_url)
    here = PostgresNotifier(db_url, own_backends=db.backend_pids)
    there = PostgresNotifier(db_url)
    await here.start()
    await there.start()
    notifying = Sql(f"SELECT {in_statement(Channel.WORK)} AS notified")
    try:
        await _until_listening(here, there)
        await _until_listening(there, here)
        await asyncio.sleep(0.2)  # nothing of the warm-up left in flight
        mine, theirs = here.version(Channel.WORK), there.version(Channel.WORK)

        async with db.driver_write() as tx:
            await tx.fetchrow(notifying)
        here.told_by_commit(Channel.WORK)
        with contextlib.suppress(RuntimeError):
            async with db.driver_write() as tx:
                await tx.fetchrow(notifying)
                raise RuntimeError("the submit failed after its INSERT: rolled back")

        assert db.backend_pids  # the pool's connection is known
        assert await _heard_after(there, theirs, 1) == 1
        assert here.version(Channel.WORK) - mine == 1  # the local wake, not its echo
    finally:
        await here.close()
        await there.close()
        await db.dispose()
    assert not db.backend_pids  # closed connections are forgotten
