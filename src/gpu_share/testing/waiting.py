"""Waiting in tests for what must happen, by a deadline, never by a count of polls.

A loaded machine (CI runs the whole suite on two busy cores) makes everything slower,
so a test waits as long as a deadline allows and fails on what did not happen, never
on how fast it happened.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

# The deadline for what must happen: generous, since only a real failure reaches it.
WAIT_SEC = 60.0

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    until: Callable[[T], object] = bool,
    *,
    what: str,
    timeout: float = WAIT_SEC,
    every: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> T:
    """Await `probe()` until `until` holds for what it returns, and return that.

    After `timeout` seconds an AssertionError says `what` never happened, with the last
    value and `detail()` (an agent's log, say).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await probe()
        if until(value):
            return value
        if loop.time() > deadline:
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"not within {timeout:g} s: {what}; last {value!r}{more}")
        await asyncio.sleep(every)
