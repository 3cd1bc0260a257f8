"""Who is calling: a Bearer key turned into a typed principal (`core.principals`) through
the replica's key cache, with failed lookups counted per address. The API's role
dependencies (`api/auth.py`) and the sign-in page (`web/`) both start here."""

import asyncio

from starlette.requests import HTTPConnection

from gpu_share import logs
from gpu_share.coordinator.core.errors import RateLimited, Unauthorized
from gpu_share.coordinator.core.keys import hash_key
from gpu_share.coordinator.core.principals import NodeCaller, Principal
from gpu_share.coordinator.http.replica import client_address
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.accounts import rate_limits
from gpu_share.coordinator.services.accounts.accounts import authenticate

MAX_KEY_LENGTH = 200
GUESSER_PAUSE_SEC = 1.0  # before a failed lookup past the limit is answered


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
    """The key's principal. A valid key gets in from any address, however many wrong keys
    came from it (a shared NAT is not locked out by one guesser): only a failed lookup
    counts against the address, and past the limit a failure answers 429 with
    `Retry-After`, after a pause, instead of 401. Used by the API and the sign-in page."""
    key_hash = hash_key(key)
    principal = replica.key_cache.get(key_hash)
    if principal is None:
        try:
            principal = await authenticate(replica.db, key)
        except Unauthorized:
            await _count_failure(replica, client)
            raise
        replica.key_cache.put(key_hash, principal)
    if isinstance(principal, NodeCaller):
        logs.node_id.set(principal.node_id)  # the request's log lines name the node
    return principal


async def _count_failure(replica: Replica, client: str) -> None:
    """Count the failure in one statement (so concurrent guesses are counted exactly); a
    guesser past the limit waits before hearing so, which paces one that waits for each
    answer, and holds nothing meanwhile: its transaction is over."""
    limit = rate_limits.failed_keys(replica.settings)
    try:
        await rate_limits.admit(replica.db, limit, client, replica.clock.now())
    except RateLimited:
        await asyncio.sleep(GUESSER_PAUSE_SEC)
        raise
