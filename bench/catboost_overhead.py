"""CatBoost training overhead: the platform against `catboost.fit` in-process.

The same training (by default a synthetic 200k × 50 regression, tuned with
--iterations to take about 60 s on the machine's CPUs) run twice, side by side:
  (a) through the platform: upload config and inputs, invoke `catboost_cpu`, poll
      until done, download the outputs; `gpu-share server` (SQLite, local store) and
      a real agent process (bwrap sandbox) on this machine, over loopback.
  (b) directly: `CatBoostRegressor(...).fit(X, y)` in this process, with the thread
      count the platform's job ran with.
Prints platform wall time / direct wall time (target ≤ 1.05), where the platform's
time went, and checks that both models predict the same (CPU, fixed seed).

Run: .venv/bin/python bench/catboost_overhead.py [--rows 200000] [--features 50]
     [--iterations 1000] [--smoke]
"""

import argparse
import asyncio
import base64
import hashlib
import io
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from catboost import CatBoostRegressor

from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.05


def synthetic(rows: int, features: int, seed: int = 0) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, features)).astype(np.float32)
    y = (
        np.sin(X[:, 0] * 2)
        + X[:, 1] * X[:, 2]
        + np.abs(X[:, 3])
        + 0.1 * X[:, 4:].sum(axis=1)
        + rng.normal(scale=0.1, size=rows)
    )
    return X, y.astype(np.float64)


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


async def wait_healthy(url: str) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(300):
            try:
                if (await http.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit("server did not start")


async def upload(http: httpx.AsyncClient, kind: str, data: bytes) -> str:
    response = await http.post(
        "/v1/artifacts",
        params={"kind": kind, "content_sha256": hashlib.sha256(data).hexdigest()},
        content=data,
    )
    response.raise_for_status()
    url: str = response.json()["url"]
    return url


async def platform_run(
    http: httpx.AsyncClient, config: dict[str, Any], inputs: bytes
) -> tuple[float, dict[str, float], dict[str, Any], bytes]:
    """One training through the platform: (wall s, phases s, invoke state, outputs bytes)."""
    phases: dict[str, float] = {}
    started = time.perf_counter()
    model_url = await upload(http, "config", json.dumps(config).encode())
    inputs_url = await upload(http, "inputs", inputs)
    phases["upload"] = time.perf_counter() - started
    body = {
        "runtime": "catboost_cpu",
        "model_url": model_url,
        "inputs_url": inputs_url,
        "timeout_sec": 3600,
    }
    submitted = time.perf_counter()
    for _ in range(600):  # 503 NO_CAPACITY until the agent has registered
        response = await http.post("/v1/gpu/invoke", json=body)
        if response.status_code != 503:
            break
        await asyncio.sleep(0.1)
    response.raise_for_status()
    invoke_id = response.json()["id"]
    while True:  # long-poll: the coordinator answers when the invoke is final
        state: dict[str, Any] = (await http.get(f"/v1/gpu/invokes/{invoke_id}?wait=30")).json()
        if state["status"] not in ("queued", "assigned", "running"):
            break
    phases["invoke"] = time.perf_counter() - submitted
    if state["status"] != "done":
        logs = (await http.get(f"/v1/gpu/invokes/{invoke_id}/logs")).text
        raise SystemExit(f"invoke {invoke_id} ended {state['status']}: {state}\n{logs[-3000:]}")
    fetched = time.perf_counter()
    result = state["result"]
    if result.get("outputs_inline_base64"):
        outputs = base64.b64decode(result["outputs_inline_base64"])
    else:
        download = await http.get(result["outputs_url"])
        download.raise_for_status()
        outputs = download.content
    phases["download"] = time.perf_counter() - fetched
    return time.perf_counter() - started, phases, state, outputs


def direct_run(
    params: dict[str, Any],
    X: np.ndarray[Any, Any],
    y: np.ndarray[Any, Any],
    threads: int,
    train_dir: Path,
) -> tuple[float, CatBoostRegressor]:
    """CatBoost as a user runs it: its default files, here kept out of the working tree."""
    model = CatBoostRegressor(**params, thread_count=threads, verbose=0, train_dir=str(train_dir))
    started = time.perf_counter()
    model.fit(X, y)
    return time.perf_counter() - started, model


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=50)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--smoke", action="store_true", help="2000 × 10, 50 iterations")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.features, args.iterations = 2000, 10, 50

    X, y = synthetic(args.rows, args.features)
    inputs = npz_bytes(X=X, y=y)
    params = {"iterations": args.iterations, "depth": args.depth, "random_seed": 7}
    config = {"task": "regression", **params}
    admin_key = "gpu_admin_" + secrets.token_urlsafe(24)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp_name:
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o700)  # the bwrap sandbox refuses job folders others can reach
        serve = ["server", "--port", str(port), "--log-level", "warning"]
        server = subprocess.Popen(
            [sys.executable, "-m", "gpu_share.cli.main", *serve],
            env={**os.environ, "GPUSHARE_DATA_DIR": str(tmp / "data")}
            | {"GPUSHARE_ADMIN_KEY": admin_key},
            cwd=ROOT,
        )
        agent: AgentProcess | None = None
        try:
            await wait_healthy(base)
            admin = {"Authorization": f"Bearer {admin_key}"}
            async with httpx.AsyncClient(base_url=base, headers=admin) as http:
                tenant = await http.post(
                    "/v1/admin/tenants", json={"name": "bench", "email": "b@example.com"}
                )
                provider = await http.post(
                    "/v1/admin/providers", json={"name": "bench", "email": "p@example.com"}
                )
            tenant_headers = {"Authorization": f"Bearer {tenant.json()['api_key']}"}
            agent = AgentProcess(base, provider.json()["enrollment_token"], tmp / "agent")
            async with httpx.AsyncClient(
                base_url=base, headers=tenant_headers, timeout=600
            ) as http:
                ours, phases, state, outputs = await platform_run(http, config, inputs)
        finally:
            if agent is not None:
                agent.stop()
            server.terminate()
            server.wait()

        metrics = state["result"]["metrics"]
        threads = int((metrics.get("extra") or {}).get("threads") or os.cpu_count() or 1)
        direct, local = direct_run(params, X, y, threads, tmp / "direct")

    with np.load(io.BytesIO(outputs)) as archive:
        platform_model = CatBoostRegressor().load_model(blob=archive["model_cbm"].tobytes())
    sample = X[:10_000]
    same = np.array_equal(platform_model.predict(sample), local.predict(sample))

    print(
        f"CatBoost regression, {args.rows} × {args.features} float32, {args.iterations} "
        f"iterations, depth {args.depth}, {threads} threads"
    )
    print(f"  (b) direct catboost.fit in-process: {direct:8.2f} s")
    print(f"  (a) through the platform:           {ours:8.2f} s")
    extra = metrics.get("extra") or {}

    def seconds(name: str) -> float:
        return float(metrics.get(name) or extra.get(name) or 0) / 1000

    print(
        f"      upload {phases['upload']:.2f} s, invoke {phases['invoke']:.2f} s (queue "
        f"{seconds('queue_ms'):.2f}, agent download {seconds('download_ms'):.2f}, on the node "
        f"{seconds('duration_ms'):.2f} of which runtime load {seconds('load_ms'):.2f} and "
        f"training + export {seconds('compute_ms'):.2f}), download {phases['download']:.2f} s"
    )
    print(f"  ratio platform / direct:            {ours / direct:8.3f}   (target <= {TARGET})")
    print(f"  same predictions:                   {same}")


if __name__ == "__main__":
    asyncio.run(main())
