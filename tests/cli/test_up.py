"""`gpu-share up` and `gpu-share server` as a newcomer runs them: real processes, real curl."""

import base64
import hashlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gpu_share.examples import DIGITS_EXPECTED_LABELS
from gpu_share.testing.models import slow_model
from gpu_share.testing.servers import free_port
from gpu_share.testing.stack import FAST_SERVER_ENV, LiveStack

ROOT = Path(__file__).resolve().parents[2]
INFO_LOG = re.compile(r"\d{4}-\d\d-\d\d [\d:,]+ INFO gpu_share\.")

pytestmark = pytest.mark.slow


class Started:
    """A CLI process whose output is collected by a thread, so reads never block the test."""

    def __init__(
        self,
        command: str,
        data_dir: Path,
        port: int,
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpu_share.cli.main", command, "--port", str(port), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={
                **os.environ,
                "GPUSHARE_DATA_DIR": str(data_dir),
                "PYTHONUNBUFFERED": "1",
                **(env or {}),
            },
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

    def interrupt(self, sig: signal.Signals = signal.SIGINT) -> str:
        """Send `sig`, wait for the exit; what the process printed after it."""
        before = len(self.output)
        self.process.send_signal(sig)
        self.process.wait(60)
        self._reader.join(10)
        return self.output[before:]


def start(
    command: str, data_dir: Path, port: int, *extra: str, env: dict[str, str] | None = None
) -> Started:
    return Started(command, data_dir, port, *extra, env=env)


def stop(started: Started) -> None:
    process = started.process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def printed_commands(banner: str) -> tuple[str, str]:
    """The banner's invoke and poll commands, as a newcomer would copy them."""
    invoke_cmd = re.search(r"(curl -s -X POST .*?)\n\n", banner, re.S)
    poll_cmd = re.search(r"(curl -s \S+/v1/gpu/invokes/INVOKE_ID .*)\n", banner)
    assert invoke_cmd and poll_cmd, banner
    return invoke_cmd.group(1), poll_cmd.group(1)


def shell_json(command: str) -> Any:
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def invoke_as_printed(banner: str) -> dict[str, Any]:
    """Run the printed curl, poll as printed, and return the finished invoke."""
    invoke_cmd, poll_cmd = printed_commands(banner)
    invoke = shell_json(invoke_cmd)
    assert invoke.get("status") == "queued", invoke
    for _ in range(300):
        state: dict[str, Any] = shell_json(poll_cmd.replace("INVOKE_ID", invoke["id"]))
        if state["status"] not in ("queued", "assigned", "running"):
            break
        time.sleep(0.2)
    return state


def assert_digits_done(state: dict[str, Any]) -> None:
    assert state["status"] == "done", state
    outputs = np.load(io.BytesIO(base64.b64decode(state["result"]["outputs_inline_base64"])))
    assert outputs["label"].tolist() == DIGITS_EXPECTED_LABELS
    assert state["result"]["metrics"]["device"] == "cpu"  # this machine has no GPU


def test_up_prints_keys_and_a_curl_invoke_that_works_as_printed(tmp_path: Path) -> None:
    port = free_port()
    up = start("up", tmp_path / "state", port)
    try:
        banner = up.read_until("Stop with Ctrl+C")
        tenant_key = re.search(r"Demo tenant key:\s+(gpu_sk_\S+)", banner)
        admin_key = re.search(r"Admin key:\s+(gpu_admin_\S+)", banner)
        assert tenant_key and admin_key, banner
        assert_digits_done(invoke_as_printed(banner))
        # quiet by default: the agent's log lines come before the banner, and no line
        # per request (heartbeats, leases, log chunks) follows it
        assert banner.index(" online: ") < banner.index("GPU Share is up")
        assert "HTTP Request" not in up.output, up.output
    finally:
        stop(up)

    again = start("up", tmp_path / "state", port)
    try:
        banner_again = again.read_until("Stop with Ctrl+C")
        assert tenant_key.group(1) in banner_again and admin_key.group(1) in banner_again
    finally:
        stop(again)


def test_the_printed_curl_works_when_the_server_enforces_checksums(tmp_path: Path) -> None:
    up = start("up", tmp_path / "state", free_port(), env={"GPUSHARE_CHECKSUM_MODE": "enforce"})
    try:
        banner = up.read_until("Stop with Ctrl+C")
        assert_digits_done(invoke_as_printed(banner))
    finally:
        stop(up)


def test_ctrl_c_stops_up_in_one_line_and_the_running_job_is_requeued_after_restart(
    tmp_path: Path,
) -> None:
    port = free_port()
    up = start("up", tmp_path / "state", port, env=FAST_SERVER_ENV)
    try:
        banner = up.read_until("Stop with Ctrl+C")
        key = re.search(r"Demo tenant key:\s+(gpu_sk_\S+)", banner)
        assert key, banner
        tenant = Tenant(f"http://127.0.0.1:{port}", key.group(1))
        invoke_id = tenant.invoke_slow_model()
        tenant.wait_for(invoke_id, "running")
        after_ctrl_c = up.interrupt()
    finally:
        stop(up)
    # the agent stopped before the server, so nothing failed on the way down: no 500
    # (the agent would warn, the server would log the error) and no traceback. An INFO
    # line the agent wrote just before the signal may still be on its way through the
    # pipe; anything louder is a failure on the way down.
    said = [line for line in after_ctrl_c.strip().splitlines() if not INFO_LOG.match(line)]
    assert said == ["stopped; 1 running job(s) will be requeued after the next start"], after_ctrl_c
    assert up.process.returncode == 0

    again = start("up", tmp_path / "state", port, env=FAST_SERVER_ENV)
    try:
        again.read_until("Stop with Ctrl+C")
        state = tenant.wait_for(invoke_id, "done")
        assert state["attempts"] == 2, state
        after_ctrl_c = again.interrupt(signal.SIGTERM)
    finally:
        stop(again)
    assert after_ctrl_c.strip() == "stopped", again.output[-6000:]
    assert again.process.returncode == 0


class Tenant:
    def __init__(self, base_url: str, key: str) -> None:
        self.http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {key}"}, trust_env=False
        )

    def invoke_slow_model(self) -> str:
        model = slow_model(8_000_000)
        uploaded = self.http.post(
            "/v1/artifacts",
            params={"kind": "model", "content_sha256": hashlib.sha256(model).hexdigest()},
            content=model,
        )
        assert uploaded.status_code == 201, uploaded.text
        created = self.http.post(
            "/v1/gpu/invoke",
            json={
                "runtime": "onnx_cpu",
                "model_url": uploaded.json()["url"],
                "inputs_url": "",
                "timeout_sec": 300,
            },
        )
        assert created.status_code == 202, created.text
        invoke_id: str = created.json()["id"]
        return invoke_id

    def wait_for(self, invoke_id: str, status: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                state: dict[str, Any] = self.http.get(f"/v1/gpu/invokes/{invoke_id}").json()
            except httpx.TransportError:  # the server is still starting
                state = {}
            if state.get("status") == status:
                return state
            assert time.monotonic() < deadline, f"never {status}: {state}"
            time.sleep(0.1)


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


def test_sigterm_stops_the_server_cleanly_while_an_agent_is_connected(tmp_path: Path) -> None:
    with LiveStack(tmp_path) as stack:  # its agent long-polls for work, its session channel open
        assert stack.server is not None
        agent = stack.agents[0]
        deadline = time.monotonic() + 30
        while "session channel connected" not in agent.log:  # a handshake under way when
            assert time.monotonic() < deadline, agent.log  # the server stops is refused
            time.sleep(0.05)
        stack.server.send_signal(signal.SIGTERM)
        code = stack.server.wait(60)
    server_log = stack.server_log.read_text()
    agent_log = stack.agents[0].log
    assert code == 0, server_log
    assert "Traceback" not in server_log and "ERROR" not in server_log, server_log
    # A refusal reads "500 INTERNAL: …" in the agent's log (`agent.client`); a timestamp's
    # milliseconds (",500") are not one.
    assert not re.search(r"(?<![,.\d])5\d\d [A-Z_]+:", agent_log), agent_log
    assert "ERROR" not in agent_log, agent_log


def test_agent_without_a_token_or_server_says_what_to_pass(tmp_path: Path) -> None:
    no_server = subprocess.run(
        [sys.executable, "-m", "gpu_share.cli.main", "agent", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")},
    )
    assert no_server.returncode == 2
    assert "--server" in no_server.stdout


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize("command", ["up", "server"])
def test_a_busy_port_is_one_clear_line_and_exit_2(
    command: str, busy_port: int, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpu_share.cli.main", command, "--port", str(busy_port)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GPUSHARE_DATA_DIR": str(tmp_path / "state")},
    )
    assert done.returncode == 2, done
    assert f"port {busy_port} is in use: pass --port or set GPUSHARE_PORT" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_make_up_passes_port_and_host_on() -> None:
    planned = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "up", "PORT=9090", "HOST=0.0.0.0"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "gpu-share up --port 9090 --host 0.0.0.0" in planned.stdout, planned.stdout
