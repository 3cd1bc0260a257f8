"""Who is calling: a Bearer key turned into a typed principal (`core.principals`) through
the replica's key cache, with failed lookups counted per address. The API's role
dependencies (`api/auth.py`) and the sign-in page (`web/`) both start here."""

from starlette.requests import HTTPConnection

from gpu_share.coordinator.core.errors import Unauthorized
from gpu_share.coordinator.core.keys import hash_key
from gpu_share.coordinator.core.principals import Principal
from gpu_share.coordinator.http.replica import client_address
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.accounts import rate_limits
from gpu_share.coordinator.services.accounts.accounts import authenticate

MAX_KEY_LENGTH = 200


def bearer_key(connection: HTTPConnection) -> str:
    header = connection.headers.get("authorization")
    if not header:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <API key>'")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or " " in key:
        raise Unauthorized("malformed Authorization header; expected 'Bearer <API key>'")
    if len(key) > MAX_KEY_LENGTH or not key.isascii():
        raise Unauthorized("API key is unknown or revoked; ask an admin for a new one")
    return key


async def principal_of_connection(connection: HTTPConnection, replica: Replica) -> Principal:
    return await principal_for_key(replica, bearer_key(connection), client_address(connection))


async def principal_for_key(replica: Replica, key: str, client: str) -> Principal:
    """The key's principal; a client that failed too many lookups lately is refused (429)
    unheard, so keys cannot be guessed at speed. Used by the API and the sign-in page."""
    key_hash = hash_key(key)
    if (cached := replica.key_cache.get(key_hash)) is not None:
        return cached
    now = replica.clock.now()
    limit = rate_limits.failed_keys(replica.settings)
    try:
        async with replica.db.read() as session:
            await rate_limits.check(session, limit, client, now)
            principal = await authenticate(session, key)
    except Unauthorized:
        async with replica.db.write() as session:
            await rate_limits.hit(session, limit, client, now)
        raise
    replica.key_cache.put(key_hash, principal)
    return principal
