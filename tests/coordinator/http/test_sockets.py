"""`bound_tcp`: the one way the coordinator's sockets are made (the public port and the
relay's)."""

import errno
import socket

import pytest

from gpu_share.coordinator.http.sockets import bound_tcp


def test_a_socket_names_tcp_so_accepted_connections_get_nodelay() -> None:
    sock = bound_tcp("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
        sock.listen()
        client = socket.create_connection(sock.getsockname(), timeout=5)
        accepted, _ = sock.accept()
        with client, accepted:
            # What asyncio checks before it sets TCP_NODELAY on an accepted connection.
            assert accepted.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_a_busy_port_raises_what_bind_raised() -> None:
    busy = bound_tcp("127.0.0.1", 0)
    busy.listen()
    try:
        with pytest.raises(OSError, match="in use") as raised:
            bound_tcp("127.0.0.1", busy.getsockname()[1])
        assert raised.value.errno == errno.EADDRINUSE
    finally:
        busy.close()
