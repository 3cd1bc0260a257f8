"""Recently verified keys, so hot paths (session forwards) skip a database read.

An entry lives `ttl` seconds. Revoking a key clears the cache of the replica that
revoked it at once; other replicas stop accepting the key within `ttl`.
"""

from gpu_share.coordinator.core.principals import Principal
from gpu_share.coordinator.replica.ttl_cache import TtlCache


class KeyCache(TtlCache[str, Principal]):
    """Principals by the hash of their key."""
