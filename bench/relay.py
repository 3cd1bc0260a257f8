"""A session forward through the wrong replica against the same forward through the right one
(issue 26 §2: goal ≤ 1.3×).

Two `gpu-share server` processes on one PostgreSQL (a scratch database), each with its
relay listener on loopback, and a real agent (bwrap sandbox) connected to the first. One
digits session; forwards of one row, one client, interleaved request by request: to the
first (which holds the node's channel) and to the second (which relays to the first).

Run: .venv/bin/python bench/relay.py [--requests 300]
"""

import argparse
import asyncio
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.databases import create_scratch_postgres, drop_scratch_postgres
from gpu_share.testing.factories import TEST_ADMIN_KEY
from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.servers import free_port

ROOT = Path(__file__).resolve().parent.parent


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_server(
    port: int, public_port: int, database_url: str, data_dir: Path, artifacts: Path
) -> subprocess.Popen[bytes]:
    """Replicas behind one address, as behind a load balancer: links name `public_port`."""
    env = {
        **os.environ,
        "GPUSHARE_DATABASE_URL": database_url,
        "GPUSHARE_DATA_DIR": str(data_dir),
        "GPUSHARE_ARTIFACT_DIR": str(artifacts),  # one machine: a shared folder
        "GPUSHARE_ADMIN_KEY": TEST_ADMIN_KEY,
        "GPUSHARE_PUBLIC_BASE_URL": f"http://127.0.0.1:{public_port}",
        "GPUSHARE_RELAY_HOST": "127.0.0.1",
        "GPUSHARE_BILLING": "free",
    }
    return subprocess.Popen(
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
        env=env,
        cwd=ROOT,
    )


async def wait_up(url: str) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(600):
            try:
                if (await http.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not start")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    database_url = await create_scratch_postgres()
    with tempfile.TemporaryDirectory(prefix="gpushare-relay-") as tmp:
        work = Path(tmp)
        ports = [free_port(), free_port()]
        servers = [
            start_server(port, ports[0], database_url, work / f"server-{n}", work / "artifacts")
            for n, port in enumerate(ports)
        ]
        first, second = (f"http://127.0.0.1:{port}" for port in ports)
        agent = None
        try:
            await wait_up(first)
            await wait_up(second)
            admin = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}
            async with httpx.AsyncClient(timeout=60) as http:
                tenant = (
                    await http.post(
                        f"{first}/v1/admin/tenants",
                        json={"name": "bench", "email": "bench@example.com"},
                        headers=admin,
                    )
                ).json()
                provider = (
                    await http.post(
                        f"{first}/v1/admin/providers",
                        json={"name": "bench", "email": "p@example.com"},
                        headers=admin,
                    )
                ).json()
                agent = AgentProcess(first, provider["enrollment_token"], work / "agent")
                auth = {"Authorization": f"Bearer {tenant['api_key']}"}
                model = (
                    await http.post(
                        f"{first}/v1/artifacts",
                        params={"kind": "model"},
                        content=DIGITS_MODEL.read_bytes(),
                        headers=auth,
                    )
                ).json()
                for _ in range(600):
                    created = await http.post(
                        f"{second}/v1/gpu/sessions",
                        json={"runtime": "onnx_cpu", "model_url": model["url"]},
                        headers=auth,
                    )
                    if created.status_code == 201:
                        break
                    await asyncio.sleep(0.2)
                session_id = created.json()["id"]
                for _ in range(600):
                    state = (
                        await http.get(f"{first}/v1/gpu/sessions/{session_id}", headers=auth)
                    ).json()
                    if state["status"] != "starting":
                        break
                    await asyncio.sleep(0.05)
                assert state["status"] == "ready", state
                buffer = io.BytesIO()
                np.savez(buffer, input=np.load(DIGITS_INPUTS)["input"][:1])
                body = buffer.getvalue()
                headers = {**auth, "Content-Type": "application/octet-stream"}
                times: dict[str, list[float]] = {"right": [], "wrong": []}
                clients = {
                    "right": httpx.AsyncClient(base_url=first, timeout=60),
                    "wrong": httpx.AsyncClient(base_url=second, timeout=60),
                }
                path = f"/v1/gpu/sessions/{session_id}/forward"
                for warm in range(20):
                    for client in clients.values():
                        assert (
                            await client.post(path, content=body, headers=headers)
                        ).is_success, warm
                for n in range(args.requests):
                    order = ("right", "wrong") if n % 2 == 0 else ("wrong", "right")
                    for name in order:
                        started = time.perf_counter()
                        answer = await clients[name].post(path, content=body, headers=headers)
                        times[name].append((time.perf_counter() - started) * 1000)
                        assert answer.status_code == 200, answer.text
                for client in clients.values():
                    await client.aclose()
        finally:
            if agent is not None:
                agent.stop()
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait()
            await drop_scratch_postgres(database_url)

    right, wrong = times["right"], times["wrong"]
    print(f"{args.requests} forwards each, one client, interleaved")
    for name, values in (("right replica (holds it)", right), ("wrong replica (relays)", wrong)):
        print(
            f"  {name:25} p50 {p(values, 0.5):6.2f} ms  p99 {p(values, 0.99):6.2f} ms  "
            f"mean {statistics.mean(values):6.2f} ms"
        )
    print(f"  wrong / right, p50: {p(wrong, 0.5) / p(right, 0.5):.2f}   (goal <= 1.3)")
    print(f"  the hop adds, p50: {p(wrong, 0.5) - p(right, 0.5):.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
