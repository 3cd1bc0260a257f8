"""The coordinator's listening sockets: the public port (`gpu-share server`, `up`) and
the relay's (`relay_listener`), made one way."""

import socket


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
