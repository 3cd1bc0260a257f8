"""The replica serving a request, and what the request says about where it came from.

Two things a request carries are the sender's to choose: its `Host` header and its
`X-Forwarded-For`. So links that reach anyone but the sender (mails, the agent's
installer and the commands that fetch it) are built from the settings alone
(`public_url`, `install_base`, `Settings.mail_base_url`), and a forwarded address counts only
when the proxy that sent it is one the operator named (`GPUSHARE_TRUSTED_PROXIES`).
"""

import ipaddress
from functools import cache
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.work.invokes import origins_of

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
INSTALL_PLACEHOLDER = "https://COORDINATOR"  # in install commands while no public URL is set


# Dependencies are `async def` even when they do not await: FastAPI runs a plain `def`
# dependency in a worker thread, a hop that cost every request about half a millisecond.
async def get_replica(connection: HTTPConnection) -> Replica:
    replica: Replica = connection.app.state.replica
    return replica


ReplicaDep = Annotated[Replica, Depends(get_replica)]


def client_address(connection: HTTPConnection) -> str:
    """The caller's address: the peer's, or behind proxies the operator trusts, the
    right-most address in `X-Forwarded-For` that none of them holds (what is left of it
    the client wrote itself, and a guesser would write a new one for every try)."""
    peer = connection.client.host if connection.client else "unknown"
    replica: Replica = connection.app.state.replica
    trusted = _networks(tuple(replica.settings.trusted_proxies))
    if not trusted or not _within(peer, trusted):
        return peer
    hops = [
        hop.strip()
        for header in connection.headers.getlist("x-forwarded-for")
        for hop in header.split(",")
    ]
    address = peer
    for hop in reversed(hops):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return address  # not written by a proxy of ours: the nearest one we trust
        address = hop
        if not _within(hop, trusted):
            return hop
    return address


@cache
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def _within(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def base_url(replica: Replica, request: Request) -> str:
    """The URL for links only the caller will follow (their artifacts' URLs, the API's
    address on their console, their own node's downloads): the configured public URL,
    else what this request came in on, which misleads no one but whoever forged it."""
    return replica.settings.public_base_url or str(request.base_url).rstrip("/")


def public_url(replica: Replica) -> str:
    """The configured public URL, or "" when none is: the installer's links come from
    nothing else, since a request's `Host` would let anyone hand out an installer that
    reports to their own machine."""
    return replica.settings.public_base_url


def install_base(replica: Replica) -> str:
    """Where an install command shown to a provider points: the public URL, else a
    placeholder that the page explains (`_no_public_url.html`)."""
    return public_url(replica) or INSTALL_PLACEHOLDER


def origins(replica: Replica, request: Request) -> set[str]:
    """The origins under which this server's own artifact URLs may arrive."""
    return origins_of(replica.settings.public_base_url, str(request.base_url))
