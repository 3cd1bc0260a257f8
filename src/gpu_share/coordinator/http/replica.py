"""The replica serving a request, and what the request says about where it came from."""

from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.work.invokes import origins_of


# Dependencies are `async def` even when they do not await: FastAPI runs a plain `def`
# dependency in a worker thread, a hop that cost every request about half a millisecond.
async def get_replica(connection: HTTPConnection) -> Replica:
    replica: Replica = connection.app.state.replica
    return replica


ReplicaDep = Annotated[Replica, Depends(get_replica)]


def client_address(connection: HTTPConnection) -> str:
    """The caller's address, as the server saw it (behind a trusted proxy: the forwarded one)."""
    return connection.client.host if connection.client else "unknown"


def base_url(replica: Replica, request: Request) -> str:
    """The public URL to put into links: configured, else what this request came in on."""
    return replica.settings.public_base_url or str(request.base_url).rstrip("/")


def origins(replica: Replica, request: Request) -> set[str]:
    """The origins under which this server's own artifact URLs may arrive."""
    return origins_of(replica.settings.public_base_url, str(request.base_url))
