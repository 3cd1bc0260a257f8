"""The relay link's wire: one TCP connection from a coordinator process to a peer's relay
listener, carrying session opens, forwards and closes and their answers
(`peer_client` sends them, `relay_listener` answers them).

A frame is 8 bytes (two big-endian u32: the length of its head, then of its body), a
JSON object (the head) and the body's bytes. A request and its answer carry the same
`id`, so one link carries many requests at once and answers come back as they end.

    holder → entry, on connect    {"relay": 1, "nonce": "…"}
    entry → holder                {"proof": seal(PURPOSE, nonce)}
    holder → entry                {"welcome": true}  or  {"refusal": {…}}, then it closes
    entry → holder, then          {"id": 7, "action": "forward", "session_id": "…", …} + payload
    holder → entry                {"id": 7, "format": "npz"} + the answer's bytes
                                  {"id": 7, "refusal": {"code", "message", "details", "headers"}}

The proof is the nonce sealed with the key every process shares (`core.signing`). The
nonce is fresh for each connection, so a proof seen on the wire opens nothing later. A
connection that does not prove itself within `HELLO_TIMEOUT_SEC`, or that sends a frame
over the limits or one that is not a frame, is closed.
"""

import asyncio
import json
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.replica.peers import PeerUnreachable
from gpu_share.protocol.errors import ErrorCode

VERSION = 1
SCHEME = "relay://"
HELLO_TIMEOUT_SEC = 5.0
HANDSHAKE_HEAD_BYTES = 4096
"""Before a peer has proved itself, a head may be this long, and it may have no body."""

_PREFIX = struct.Struct(">II")

KEEP_ALIVE_PROBES = (10, 5, 3)
"""TCP keep-alive on a link (idle seconds, seconds between probes, probes): a peer whose
machine vanished without closing it (power, a network that split) is noticed within
~25 s, and the requests waiting on the link fail then, not at their own timeouts."""


class FrameError(Exception):
    """The other end broke the link's protocol."""


@dataclass(frozen=True)
class Frame:
    head: dict[str, Any]
    body: bytes = field(default=b"", repr=False)


async def read_frame(reader: asyncio.StreamReader, *, max_head: int, max_body: int) -> Frame:
    """The next frame; `asyncio.IncompleteReadError` when the link ends first."""
    head_size, body_size = _PREFIX.unpack(await reader.readexactly(_PREFIX.size))
    if head_size > max_head or body_size > max_body:
        raise FrameError(
            f"a frame of {head_size} + {body_size} bytes is over this link's limits "
            f"({max_head} + {max_body})"
        )
    head_bytes = await reader.readexactly(head_size)
    body = await reader.readexactly(body_size) if body_size else b""
    try:
        head = json.loads(head_bytes)
    except ValueError as exc:
        raise FrameError("a frame's head is not JSON") from exc
    if not isinstance(head, dict):
        raise FrameError("a frame's head is not a JSON object")
    return Frame(head, body)


def write_frame(writer: asyncio.StreamWriter, frame: Frame) -> None:
    """Queued whole in one call, so frames written by concurrent tasks never interleave."""
    head = json.dumps(frame.head, separators=(",", ":")).encode()
    writer.writelines([_PREFIX.pack(len(head), len(frame.body)), head, frame.body])


def keep_alive(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEP_ALIVE_PROBES
    for option, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", count),
    ):
        if hasattr(socket, option):  # Linux; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def refusal_head(exc: ApiError) -> dict[str, Any]:
    return {
        "code": exc.code.value,
        "message": exc.message,
        "details": exc.details,
        "headers": exc.headers,
    }


def refusal_error(relay_url: str, refusal: Any) -> Exception:
    """A refusal read off a link (`refusal_head`), as the `ApiError` raised there; a
    malformed one as the holder being unreachable."""
    try:
        return ApiError(
            str(refusal["message"]),
            code=ErrorCode(refusal["code"]),
            details=refusal.get("details"),
            headers=dict(refusal.get("headers") or {}),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return PeerUnreachable(f"{relay_url} answered a malformed refusal: {refusal!r}")


def address(relay_url: str) -> tuple[str, int]:
    """`relay://host:port` (an IPv6 host in brackets) as (host, port); ValueError else."""
    if not relay_url.startswith(SCHEME):
        raise ValueError(f"{relay_url!r} is not a {SCHEME} address")
    host, _, port = relay_url.removeprefix(SCHEME).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{relay_url!r} is not {SCHEME}host:port")
    return host.removeprefix("[").removesuffix("]"), int(port)


def url_of(host: str, port: int) -> str:
    return f"{SCHEME}[{host}]:{port}" if ":" in host else f"{SCHEME}{host}:{port}"
