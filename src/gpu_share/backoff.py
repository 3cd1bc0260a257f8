"""Capped exponential backoff with jitter: the one retry pacing of the agent and coordinator.

    delay = Backoff(first=0.5, cap=10.0)
    while ...:
        try: ...
        except Transient:
            await delay.sleep(stop)   # 0.5, 1, 2, 4, 8, 10, 10 … seconds (± jitter)
            continue
        delay.reset()

`sleep` returns early (False) when `stop` is set, so a loop that backs off still ends
promptly on shutdown.
"""

import asyncio
import contextlib
import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    first: float = 0.5
    cap: float = 10.0
    factor: float = 2.0
    jitter: float = 0.2  # each pause is scaled by a random factor in [1 - jitter, 1 + jitter]
    _next: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._next = self.first

    @property
    def upcoming(self) -> float:
        """The next pause before jitter (for messages such as "retrying in 2.0 s")."""
        return self._next

    def next_delay(self) -> float:
        delay = self._next * random.uniform(1 - self.jitter, 1 + self.jitter)  # noqa: S311
        self._next = min(self._next * self.factor, self.cap)
        return delay

    def reset(self) -> None:
        self._next = self.first

    async def sleep(self, stop: asyncio.Event | None = None) -> bool:
        """Pause for the next delay; False when `stop` was set before or during it."""
        delay = self.next_delay()
        if stop is None:
            await asyncio.sleep(delay)
            return True
        if stop.is_set():
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        return not stop.is_set()
