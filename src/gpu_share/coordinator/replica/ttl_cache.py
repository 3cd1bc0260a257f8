"""A small in-process cache whose entries live `ttl` seconds, the least recently used
dropped past `max_entries`: what one process remembers to skip a database read."""

from collections import OrderedDict
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from gpu_share.coordinator.core.clock import Clock

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(self, clock: Clock, ttl_sec: float, max_entries: int = 10_000) -> None:
        self._clock = clock
        self._ttl = timedelta(seconds=ttl_sec)
        self._max = max_entries
        self._entries: OrderedDict[K, tuple[V, datetime]] = OrderedDict()

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, expires = entry
        if expires <= self._clock.now():
            del self._entries[key]
            return None
        return value

    def put(self, key: K, value: V) -> None:
        if self._ttl <= timedelta(0):
            return
        self._entries[key] = (value, self._clock.now() + self._ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def pop(self, key: K) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
