"""`Backoff`: the one retry pacing of the agent and the coordinator."""

import asyncio

from gpu_share.backoff import Backoff


def test_pauses_double_up_to_the_cap() -> None:
    delay = Backoff(first=0.5, cap=4.0, jitter=0.0)
    assert [delay.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_jitter_keeps_each_pause_within_its_band() -> None:
    delay = Backoff(first=1.0, cap=8.0, jitter=0.2)
    pauses = []
    for _ in range(50):
        delay.reset()
        pauses += [(expected, delay.next_delay()) for expected in (1.0, 2.0, 4.0, 8.0, 8.0)]
    assert all(expected * 0.8 <= pause <= expected * 1.2 for expected, pause in pauses)
    assert len({pause for _, pause in pauses}) > 5  # and it does vary


def test_reset_starts_over_from_the_first_pause() -> None:
    delay = Backoff(first=0.5, cap=10.0, jitter=0.0)
    for _ in range(4):
        delay.next_delay()
    assert delay.upcoming == 8.0
    delay.reset()
    assert delay.upcoming == 0.5
    assert delay.next_delay() == 0.5


async def test_sleep_returns_false_as_soon_as_stop_is_set() -> None:
    delay = Backoff(first=3600.0, cap=3600.0)
    stop = asyncio.Event()
    sleeping = asyncio.create_task(delay.sleep(stop))
    await asyncio.sleep(0)  # let it start its hour-long pause
    stop.set()
    assert await asyncio.wait_for(sleeping, 30) is False


async def test_sleep_with_stop_already_set_does_not_pause() -> None:
    delay = Backoff(first=3600.0, cap=3600.0)
    stop = asyncio.Event()
    stop.set()
    assert await asyncio.wait_for(delay.sleep(stop), 30) is False


async def test_sleep_that_runs_its_course_returns_true() -> None:
    delay = Backoff(first=0.01, cap=0.01)
    assert await delay.sleep(asyncio.Event()) is True
    assert await delay.sleep() is True
