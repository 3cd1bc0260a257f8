"""The coordinator's listening sockets: the public port (`gpu-share server`, `up`) and
the relay's (`relay_listener`), made one way."""

import socket

KEEP_ALIVE_SEC = 75
"""How long an idle keep-alive connection to our servers stays open. uvicorn's default
(5 s) is the agents' heartbeat interval and httpx's own keep-alive expiry: a request
sent on a connection the server was closing at that moment failed with a read error
(10–32 heartbeats in 30 s among 300 agents, `bench/scale.py`; none since). Longer than
the idle timeouts of the load balancers put in front (60 s is common), so they close
first, never the server under them."""


def bound_tcp(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (port 0: any free one), not listening yet;
    OSError as `bind` raises it.

    IPPROTO_TCP is named explicitly: asyncio sets TCP_NODELAY only on accepted sockets
    whose protocol says TCP. Without it every keep-alive answer written in two pieces
    waited for the client's delayed ACK (~40 ms a request)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
