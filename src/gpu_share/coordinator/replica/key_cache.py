"""Recently verified keys, so hot paths (session forwards) skip a database read.

An entry lives `ttl` seconds. Revoking a key clears the cache of the replica that
revoked it at once; other replicas stop accepting the key within `ttl`.
"""

from collections import OrderedDict
from datetime import datetime, timedelta

from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.principals import Principal


class KeyCache:
    def __init__(self, clock: Clock, ttl_sec: float, max_entries: int = 10_000) -> None:
        self._clock = clock
        self._ttl = timedelta(seconds=ttl_sec)
        self._max = max_entries
        self._entries: OrderedDict[str, tuple[Principal, datetime]] = OrderedDict()

    def get(self, key_hash: str) -> Principal | None:
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        principal, expires = entry
        if expires <= self._clock.now():
            del self._entries[key_hash]
            return None
        return principal

    def put(self, key_hash: str, principal: Principal) -> None:
        if self._ttl <= timedelta(0):
            return
        self._entries[key_hash] = (principal, self._clock.now() + self._ttl)
        self._entries.move_to_end(key_hash)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
