"""`gpu-share up` and `gpu-share server` as a newcomer runs them: real processes, real curl."""

import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from gpu_share.examples import DIGITS_EXPECTED_LABELS
from gpu_share.testing.servers import free_port

pytestmark = pytest.mark.slow


class Started:
    """A CLI process whose output is collected by a thread, so reads never block the test."""

    def __init__(self, command: str, data_dir: Path, port: int, *extra: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpu_share.cli.main", command, "--port", str(port), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "GPUSHARE_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"},
        )
        self.output = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output += line

    def read_until(self, marker: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while marker not in self.output:
            if time.monotonic() > deadline or self.process.poll() is not None:
                time.sleep(0.2)
                raise AssertionError(f"{marker!r} never printed; output:\n{self.output}")
            time.sleep(0.05)
        return self.output


def start(command: str, data_dir: Path, port: int, *extra: str) -> Started:
    return Started(command, data_dir, port, *extra)


def stop(started: Started) -> None:
    process = started.process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_up_prints_keys_and_a_curl_invoke_that_works_as_printed(tmp_path: Path) -> None:
    port = free_port()
    up = start("up", tmp_path / "state", port)
    try:
        banner = up.read_until("Stop with Ctrl+C")
        tenant_key = re.search(r"Demo tenant key:\s+(gpu_sk_\S+)", banner)
        admin_key = re.search(r"Admin key:\s+(gpu_admin_\S+)", banner)
        assert tenant_key and admin_key, banner
        invoke_cmd = re.search(r"(curl -s -X POST .*?)\n\n", banner, re.S)
        poll_cmd = re.search(r"(curl -s \S+/v1/gpu/invokes/INVOKE_ID .*)\n", banner)
        assert invoke_cmd and poll_cmd, banner

        created = subprocess.run(
            ["bash", "-c", invoke_cmd.group(1)], capture_output=True, text=True, check=True
        )
        invoke = json.loads(created.stdout)
        assert invoke["status"] == "queued", invoke
        for _ in range(300):
            polled = subprocess.run(
                ["bash", "-c", poll_cmd.group(1).replace("INVOKE_ID", invoke["id"])],
                capture_output=True,
                text=True,
                check=True,
            )
            state = json.loads(polled.stdout)
            if state["status"] not in ("queued", "assigned", "running"):
                break
            time.sleep(0.2)
        assert state["status"] == "done", state
        outputs = np.load(io.BytesIO(base64.b64decode(state["result"]["outputs_inline_base64"])))
        assert outputs["label"].tolist() == DIGITS_EXPECTED_LABELS
        assert state["result"]["metrics"]["device"] == "cpu"  # this machine has no GPU
    finally:
        stop(up)

    again = start("up", tmp_path / "state", port)
    try:
        banner_again = again.read_until("Stop with Ctrl+C")
        assert tenant_key.group(1) in banner_again and admin_key.group(1) in banner_again
    finally:
        stop(again)


def test_server_prints_a_generated_admin_key_once_and_serves(tmp_path: Path) -> None:
    port = free_port()
    server = start("server", tmp_path / "state", port)
    try:
        output = server.read_until("Admin key (shown once")
        key = re.search(r"(gpu_admin_\S+)", output)
        assert key
        for _ in range(100):
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert health.json()["status"] == "ok"
        tenants = httpx.get(
            f"http://127.0.0.1:{port}/v1/admin/tenants",
            headers={"Authorization": f"Bearer {key.group(1)}"},
        )
        assert tenants.status_code == 200
    finally:
        stop(server)
    second = start("server", tmp_path / "state", port)
    try:
        output = second.read_until("Uvicorn running")
        assert "Admin key" not in output
    finally:
        stop(second)


def test_agent_without_a_token_or_server_says_what_to_pass(tmp_path: Path) -> None:
    no_server = subprocess.run(
        [sys.executable, "-m", "gpu_share.cli.main", "agent", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")},
    )
    assert no_server.returncode == 2
    assert "--server" in no_server.stdout
