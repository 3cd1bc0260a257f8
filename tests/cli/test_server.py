"""`gpu-share server` as a process: with `GPUSHARE_LOG_FORMAT=json` every line it writes,
uvicorn's included, is one JSON object; a bad metrics folder stops it saying so; an idle
connection stays open past an agent's heartbeat interval."""

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.factories import TEST_ADMIN_KEY
from gpu_share.testing.servers import free_port

T = TypeVar("T")


def _serve(tmp_path: Path, port: int, **env: str) -> subprocess.Popen[str]:
    """`gpu-share server` on `port`, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_share.cli.main", "server", "--port", str(port)],
        env={
            **os.environ,
            "GPUSHARE_DATA_DIR": str(tmp_path),
            "GPUSHARE_ADMIN_KEY": TEST_ADMIN_KEY,
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _once_up(server: subprocess.Popen[str], attempt: Callable[[], T]) -> T:
    """`attempt`'s answer once the server takes connections."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return attempt()
        except (httpx.TransportError, OSError):
            assert time.monotonic() < deadline, "the server did not start"
            assert server.poll() is None, "the server exited"
            time.sleep(0.1)


def _response(connection: socket.socket) -> bytes:
    """One whole HTTP/1.1 answer read off a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return data  # closed
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    assert length, head
    while len(body) < int(length.group(1)):
        chunk = connection.recv(65536)
        assert chunk, "closed in the middle of an answer"
        body += chunk
    return head + b"\r\n\r\n" + body


def test_json_logs_are_one_object_per_line_from_start_to_stop(tmp_path: Path) -> None:
    port = free_port()
    server = _serve(tmp_path, port, GPUSHARE_LOG_FORMAT="json", PYTHONUNBUFFERED="1")
    try:
        base = f"http://127.0.0.1:{port}"
        answer = _once_up(server, lambda: httpx.get(f"{base}/health", timeout=5, trust_env=False))
        assert len(answer.headers["x-request-id"]) == 16
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    messages = [line["message"] for line in lines]
    assert any("Uvicorn running on" in m for m in messages), messages
    assert any("GPUSHARE_PUBLIC_BASE_URL is not set" in m for m in messages), messages
    # once started, the server takes its startup heap out of the collector's full passes
    frozen = [m for m in messages if m.startswith("set the startup heap aside")]
    assert len(frozen) == 1 and int(frozen[0].split(": ")[1].split()[0]) > 10_000, messages
    assert {line["level"] for line in lines} <= {"debug", "info", "warning", "error"}
    assert all({"ts", "logger"} <= line.keys() for line in lines)


def test_a_metrics_folder_that_is_not_there_stops_the_server_saying_so(tmp_path: Path) -> None:
    missing = tmp_path / "not-made"
    done = subprocess.run(
        [sys.executable, "-m", "gpu_share.cli.main", "server", "--port", str(free_port())],
        env={
            **os.environ,
            "GPUSHARE_DATA_DIR": str(tmp_path),
            "PROMETHEUS_MULTIPROC_DIR": str(missing),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"gpu-share server: PROMETHEUS_MULTIPROC_DIR={missing} is not a folder: create it "
        "(empty) before the server processes start, or unset it to count each process apart"
    )


def test_a_connection_idle_for_a_heartbeat_interval_is_still_open(tmp_path: Path) -> None:
    # An agent's heartbeat reuses its connection after 5 s idle: the server must not be
    # closing it at that moment (uvicorn's own keep-alive is 5 s).
    port = free_port()
    server = _serve(tmp_path, port)
    request = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    try:
        connection = _once_up(
            server, lambda: socket.create_connection(("127.0.0.1", port), timeout=10)
        )
        with connection:
            for pause in (0.0, Settings().heartbeat_interval_sec + 1):
                time.sleep(pause)
                connection.sendall(request)
                answer = _response(connection)
                assert answer.startswith(b"HTTP/1.1 200"), (pause, answer[:80])
    finally:
        server.terminate()
        server.communicate(timeout=30)
