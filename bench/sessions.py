"""Session forwards against a bare relay with the same hops (issue: sessions).

Side by side in one run, on loopback:
  (a) forward latency p50/p99, one client, the example digits model (1 row):
      ours (`gpu-share server` + agent process, bwrap sandbox) vs bench/bare_relay.py
      (an HTTP server relaying over a WebSocket to a peer that runs the same model;
      no database, no auth). Target p50 ≤ 1.3× the bare relay.
  (b) throughput with 8 concurrent clients, same comparison.
  (c) a model computing ~10 ms per call: our session latency / in-process onnxruntime
      with the same thread count. Target ≤ 1.15.
The script also reports where a forward's time goes on our side.

Run: .venv/bin/python bench/sessions.py [--requests 300]
"""

import argparse
import asyncio
import io
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import psutil

from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.models import busy_model
from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
THREADS = 2  # what the agent gives a session on this machine (its cores / 1 slot)


def npz(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_up(url: str) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(300):
            try:
                await http.get(url)
                return
            except httpx.TransportError:
                await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


async def latencies(
    http: httpx.AsyncClient, url: str, body: bytes, n: int, headers: dict[str, str]
) -> list[float]:
    result = []
    for _ in range(n):
        start = time.perf_counter()
        response = await http.post(url, content=body, headers=headers)
        assert response.status_code == 200, response.text
        result.append((time.perf_counter() - start) * 1000)
    return result


async def throughput(
    url: str, body: bytes, clients: int, per_client: int, headers: dict[str, str]
) -> float:
    async def one() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            for _ in range(per_client):
                response = await http.post(url, content=body, headers=headers)
                assert response.status_code == 200

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return clients * per_client / (time.perf_counter() - start)


def tree(pid: int) -> list[psutil.Process]:
    """A process and all it started (the agent, its sandbox and the model process in it)."""
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def cpu_of(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(times.user + times.system)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    n = args.requests
    digits_body = npz(input=np.load(DIGITS_INPUTS)["input"][:1])
    heavy_model = busy_model(10, 1024, 128)  # ~10 ms with 2 threads; 4 KiB in and out
    heavy_input = np.random.default_rng(1).random((1, 1024), dtype=np.float32)
    heavy_body = npz(x=heavy_input)

    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "heavy.onnx").write_bytes(heavy_model)
        admin = "gpu_admin_" + secrets.token_urlsafe(24)
        port, relay_port, peer_port = free_port(), free_port(), free_port()
        heavy_relay_port, heavy_peer_port = free_port(), free_port()
        base = f"http://127.0.0.1:{port}"
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpu_share.cli.main",
                    "server",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                env={
                    **os.environ,
                    "GPUSHARE_DATA_DIR": str(tmp / "data"),
                    "GPUSHARE_ADMIN_KEY": admin,
                },
            ),
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "bench/bare_relay.py"),
                    "peer",
                    str(DIGITS_MODEL),
                    str(peer_port),
                    str(THREADS),
                ]
            ),
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "bench/bare_relay.py"),
                    "peer",
                    str(tmp / "heavy.onnx"),
                    str(heavy_peer_port),
                    str(THREADS),
                ]
            ),
        ]
        agent: AgentProcess | None = None
        try:
            await wait_up(f"{base}/health")
            await asyncio.sleep(1.5)  # the peers load their models
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(ROOT / "bench/bare_relay.py"),
                        "relay",
                        str(peer_port),
                        str(relay_port),
                    ]
                )
            )
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(ROOT / "bench/bare_relay.py"),
                        "relay",
                        str(heavy_peer_port),
                        str(heavy_relay_port),
                    ]
                )
            )
            await wait_up(f"http://127.0.0.1:{relay_port}/")
            await wait_up(f"http://127.0.0.1:{heavy_relay_port}/")
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                a = {"Authorization": f"Bearer {admin}"}
                tenant = (
                    await http.post(
                        "/v1/admin/tenants", json={"name": "b", "email": "b@example.com"}, headers=a
                    )
                ).json()
                token = (
                    await http.post(
                        "/v1/admin/providers",
                        json={"name": "p", "email": "p@example.com"},
                        headers=a,
                    )
                ).json()["enrollment_token"]
                auth = {"Authorization": f"Bearer {tenant['api_key']}"}
                agent = AgentProcess(base, token, tmp / "agent", sandbox="bwrap")
                sessions = {}
                for name, data in (("digits", DIGITS_MODEL.read_bytes()), ("heavy", heavy_model)):
                    url = (
                        await http.post(
                            "/v1/artifacts", params={"kind": "model"}, content=data, headers=auth
                        )
                    ).json()["url"]
                    for _ in range(200):
                        r = await http.post(
                            "/v1/gpu/sessions",
                            json={"runtime": "onnx_cpu", "model_url": url, "max_concurrency": 8},
                            headers=auth,
                        )
                        if r.status_code == 201:
                            break
                        await asyncio.sleep(0.1)
                    session_id = r.json()["id"]
                    for _ in range(300):
                        if (await http.get(f"/v1/gpu/sessions/{session_id}", headers=auth)).json()[
                            "status"
                        ] == "ready":
                            break
                        await asyncio.sleep(0.05)
                    sessions[name] = f"{base}/v1/gpu/sessions/{session_id}/forward"
                octet = {"Content-Type": "application/octet-stream"}
                ours_url, bare_url = sessions["digits"], f"http://127.0.0.1:{relay_port}/"
                await latencies(http, ours_url, digits_body, 30, {**auth, **octet})  # warm up
                await latencies(http, bare_url, digits_body, 30, octet)
                ours, bare = [], []
                ours_side = [psutil.Process(procs[0].pid), *tree(agent.process.pid)]
                bare_side = [psutil.Process(procs[1].pid), psutil.Process(procs[3].pid)]
                cpu = {"server": 0.0, "agent": 0.0, "relay": 0.0, "peer": 0.0}
                for _ in range(5):  # interleaved, so drift hits both alike
                    before = [cpu_of(process) for process in ours_side]
                    ours += await latencies(http, ours_url, digits_body, n // 5, {**auth, **octet})
                    after = [cpu_of(process) for process in ours_side]
                    cpu["server"] += after[0] - before[0]
                    cpu["agent"] += sum(after[1:]) - sum(before[1:])
                    before = [cpu_of(process) for process in bare_side]
                    bare += await latencies(http, bare_url, digits_body, n // 5, octet)
                    after = [cpu_of(process) for process in bare_side]
                    cpu["relay"] += after[1] - before[1]
                    cpu["peer"] += after[0] - before[0]
                tp_ours = await throughput(ours_url, digits_body, 8, n // 8, {**auth, **octet})
                tp_bare = await throughput(bare_url, digits_body, 8, n // 8, octet)

                heavy_ours = await latencies(
                    http, sessions["heavy"], heavy_body, 40, {**auth, **octet}
                )
                heavy_bare = await latencies(
                    http, f"http://127.0.0.1:{heavy_relay_port}/", heavy_body, 40, octet
                )
            options = ort.SessionOptions()
            options.intra_op_num_threads = THREADS
            local = ort.InferenceSession(heavy_model, options, providers=["CPUExecutionProvider"])
            local.run(None, {"x": heavy_input})
            in_process = []
            for _ in range(40):
                start = time.perf_counter()
                local.run(None, {"x": heavy_input})
                in_process.append((time.perf_counter() - start) * 1000)
        finally:
            if agent is not None:
                agent.stop()
            for proc in procs:
                proc.terminate()
                proc.wait()

    print(f"(a) forward latency, digits model, 1 row, {len(ours)} requests each (ms):")
    print(f"    ours:       p50 {statistics.median(ours):6.2f}   p99 {p(ours, 0.99):6.2f}")
    print(f"    bare relay: p50 {statistics.median(bare):6.2f}   p99 {p(bare, 0.99):6.2f}")
    ratio = statistics.median(ours) / statistics.median(bare)
    print(f"    p50 ratio ours / bare: {ratio:.2f}   (target <= 1.3)")
    per = {name: seconds * 1000 / len(ours) for name, seconds in cpu.items()}
    print(
        f"    CPU per forward: ours server {per['server']:.2f} + agent and its sandbox "
        f"{per['agent']:.2f} ms; bare relay {per['relay']:.2f} + its peer {per['peer']:.2f} ms"
    )
    print("(b) throughput, 8 concurrent clients:")
    ratio = tp_ours / tp_bare
    print(f"    ours {tp_ours:7.0f} req/s   bare relay {tp_bare:7.0f} req/s   ratio {ratio:.2f}")
    print("(c) ~10 ms model (1x1024 in, tiled to 128 rows through 10 MatMul+Relu), p50 ms:")
    ours_ms, bare_ms = statistics.median(heavy_ours), statistics.median(heavy_bare)
    local_ms = statistics.median(in_process)
    print(
        f"    ours {ours_ms:.2f}   bare relay {bare_ms:.2f}   in-process onnxruntime {local_ms:.2f}"
    )
    print(f"    ratio ours / in-process: {ours_ms / local_ms:.2f}   (target <= 1.15)")


if __name__ == "__main__":
    asyncio.run(main())
