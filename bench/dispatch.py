"""Dispatch: how fast work reaches agents (issue: agent and invoke pipeline).

Side by side in one run, on PostgreSQL, against `gpu-share server` in its own process:
  (a) lease throughput: N simulated agents over HTTP, one job per lease, each way an
      agent can take one: the result bringing the next job (one request a job, what a
      busy agent does), the fast path (a lease that is the start, then the result) and
      the three-request path (lease, start, result); vs a bare asyncpg
      `FOR UPDATE SKIP LOCKED` claim-and-complete loop with N workers on a table in the
      same database; and vs a minimal Starlette + asyncpg app (`minimal_dispatch_app.py`)
      serving the same three requests (submit; lease; result bringing the next) with one
      claim statement, over HTTP from the same number of agents. All five in rounds whose
      order turns, ours on the same N nodes; each server's CPU per job is read around
      each submit and each drain. Targets: ≥ 0.8 of the minimal app, ≤ 5 ms CPU a job.
  (b) enqueue-to-agent latency for an idle long-polling agent: POST /v1/gpu/invoke until
      the agent's lease answer arrives. Target p50 ≤ 5 ms.
  (c) end-to-end invoke latency of the example digits model with a warm cache (a real
      agent process, bwrap sandbox), the tenant asking with `Prefer: wait` (one request)
      and submitting then long-polling with `?wait=` (two), vs onnxruntime in-process
      plus one HTTP round trip, all three interleaved sample by sample.

`--priced`: the provider prices CPU work and the tenant has a balance, so every job
reserves at its submit and is charged at its result, as a paid job is (else all is free).

Run: .venv/bin/python bench/dispatch.py [--jobs 1000] [--agents 4] [--rounds 5] [--priced]
"""

import argparse
import asyncio
import hashlib
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import numpy as np
import psutil

from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.protocol import agent as wire
from gpu_share.testing.databases import create_scratch_postgres, drop_scratch_postgres
from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.servers import free_port
from gpu_share.testing.simulated_agent import SimulatedAgent, done_report

ROOT = Path(__file__).resolve().parent.parent
CPU_BODY = {
    "runtime": "onnx_cpu",
    "model_url": "https://example.com/model.onnx",
    "inputs_url": "",
    "timeout_sec": 600,
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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


async def create_bare_table(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "CREATE TABLE bench_jobs (id bigserial PRIMARY KEY, status text NOT NULL, "
        "created_at timestamptz NOT NULL DEFAULT now(), lease_token text)"
    )
    await conn.execute("CREATE INDEX ON bench_jobs (status, created_at)")
    await conn.close()


async def bare_skip_locked(dsn: str, jobs: int, workers: int) -> float:
    """The baseline: claim one row with SKIP LOCKED, mark it done, repeat; returns the
    seconds `workers` take to drain `jobs` new rows."""
    conn = await asyncpg.connect(dsn)
    await conn.executemany(
        "INSERT INTO bench_jobs (status) VALUES ('queued')", [() for _ in range(jobs)]
    )
    await conn.close()

    async def worker() -> None:
        c = await asyncpg.connect(dsn)
        while True:
            async with c.transaction():
                row = await c.fetchrow(
                    "SELECT id FROM bench_jobs WHERE status = 'queued' ORDER BY created_at "
                    "FOR UPDATE SKIP LOCKED LIMIT 1"
                )
                if row is None:
                    break
                token = secrets.token_hex(16)
                await c.execute(
                    "UPDATE bench_jobs SET status = 'running', lease_token = $2 WHERE id = $1",
                    row["id"],
                    token,
                )
            await c.execute(
                "UPDATE bench_jobs SET status = 'done' WHERE id = $1 AND lease_token = $2",
                row["id"],
                token,
            )
        await c.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return time.perf_counter() - start


@dataclass
class Throughput:
    """One way's rounds added up."""

    jobs: int = 0
    seconds: float = 0.0
    submit_cpu_sec: float = 0.0
    """The server's CPU (user + system) while the invokes were submitted."""
    drain_cpu_sec: float = 0.0
    """The server's CPU while the agents leased the jobs and reported their results."""

    @property
    def jobs_per_sec(self) -> float:
        return self.jobs / self.seconds

    @property
    def submit_cpu_ms(self) -> float:
        return self.submit_cpu_sec * 1000 / self.jobs

    @property
    def drain_cpu_ms(self) -> float:
        return self.drain_cpu_sec * 1000 / self.jobs

    @property
    def cpu_ms(self) -> float:
        return self.submit_cpu_ms + self.drain_cpu_ms


def cpu_sec(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def ours_round(
    base: str,
    tenant: dict[str, str],
    agents: list[SimulatedAgent],
    jobs: int,
    server: psutil.Process,
    into: Throughput,
    *,
    mode: str,
) -> None:
    """Submit `jobs` invokes, then the agents drain them, one job per lease; adds the
    time and the server's CPU to `into`. `mode`: "three" (lease, start, result), "fast"
    (the lease is the start; lease and result) or "next" (the result brings the next
    job: one request a job)."""

    async def keep_online() -> None:  # submitting takes longer than a node stays online
        while True:
            for agent in agents:
                await agent.heartbeat([])
            await asyncio.sleep(5)

    beating = asyncio.create_task(keep_online())
    async with httpx.AsyncClient(base_url=base, headers=tenant, timeout=30) as http:
        before = cpu_sec(server)
        for _ in range(jobs):
            response = await http.post("/v1/gpu/invoke", json=CPU_BODY)
            assert response.status_code == 202, response.text
        into.submit_cpu_sec += cpu_sec(server) - before
    beating.cancel()

    following = wire.LeaseRequest(slots=1, free_gpus=0, wait_sec=0, start=True)

    async def drain(agent: SimulatedAgent) -> None:
        while jobs_left := await agent.lease(slots=1, wait=0, start=mode != "three"):
            while jobs_left:
                job = jobs_left.pop()
                if mode == "three":
                    await agent.client.start(job.invoke_id, job.lease_token)
                report = done_report(job).model_copy(
                    update={"log": "[agent] done\n", "next": following if mode == "next" else None}
                )
                handed_on = await agent.client.report(job.invoke_id, report, retry_for=0)
                agent.leased.extend(j.invoke_id for j in handed_on)
                jobs_left += handed_on

    for agent in agents:
        agent.leased.clear()
    start, before = time.perf_counter(), cpu_sec(server)
    await asyncio.gather(*(drain(a) for a in agents))
    into.seconds += time.perf_counter() - start
    into.drain_cpu_sec += cpu_sec(server) - before
    done = sum(len(a.leased) for a in agents)
    assert done == jobs, (done, jobs)
    into.jobs += jobs


async def minimal_round(
    base: str, key: str, workers: int, jobs: int, app: psutil.Process, into: Throughput
) -> None:
    """The minimal app's round, as `ours_round` in "next" mode: `jobs` submits, then
    `workers` agents drain them, each result bringing the next job."""
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
        before = cpu_sec(app)
        for _ in range(jobs):
            response = await http.post("/v1/gpu/invoke", json=CPU_BODY)
            assert response.status_code == 202, response.text
        into.submit_cpu_sec += cpu_sec(app) - before

    done: list[int] = []

    async def drain(node: str) -> None:
        async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
            jobs_left = (await http.post("/v1/agent/lease", json={"node": node})).json()["jobs"]
            while jobs_left:
                job = jobs_left.pop()
                report = {
                    "node": node,
                    "lease_token": job["lease_token"],
                    "result": {"status": "done", "outputs": None},
                    "next": True,
                }
                r = await http.post(f"/v1/agent/invokes/{job['invoke_id']}/result", json=report)
                assert r.status_code == 200, r.text
                done.append(job["invoke_id"])
                jobs_left += r.json()["jobs"]

    start, before = time.perf_counter(), cpu_sec(app)
    await asyncio.gather(*(drain(f"node-{n}") for n in range(workers)))
    into.seconds += time.perf_counter() - start
    into.drain_cpu_sec += cpu_sec(app) - before
    assert len(done) == len(set(done)) == jobs, (len(done), jobs)
    into.jobs += jobs


async def throughputs(
    base: str,
    token: str,
    tenant: dict[str, str],
    dsn: str,
    jobs: int,
    workers: int,
    rounds: int,
    server: psutil.Process,
    minimal: tuple[str, str, psutil.Process],
) -> tuple[float, dict[str, Throughput]]:
    """(a): the bare loop, the minimal app (`minimal`: its URL, key and process) and our
    three ways, `rounds` rounds of `jobs / rounds` each, the order turning every round
    (no way always runs first or after the same one), on the same `workers` nodes
    throughout. Returns the bare loop's jobs/s, and the minimal app's and ours."""
    agents = [SimulatedAgent(base) for _ in range(workers)]
    for agent in agents:
        await agent.register(token)
    await create_bare_table(dsn)
    per_round = jobs // rounds
    bare = Throughput()
    ours = {mode: Throughput() for mode in ("three", "fast", "next", "minimal")}
    ways = ["bare", *ours]
    for r in range(rounds):
        for way in ways[r % len(ways) :] + ways[: r % len(ways)]:
            if way == "bare":
                bare.seconds += await bare_skip_locked(dsn, per_round, workers)
                bare.jobs += per_round
            elif way == "minimal":
                await minimal_round(*minimal[:2], workers, per_round, minimal[2], ours[way])
            else:
                await ours_round(base, tenant, agents, per_round, server, ours[way], mode=way)
    for agent in agents:
        await agent.aclose()
    return bare.jobs_per_sec, ours


async def request_floor_ms(base: str, server: psutil.Process, requests: int = 1000) -> float:
    """The server's CPU for a request that does no work: a 404 under `/v1/` (the
    middleware, the routing and the error handler every request pays)."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        for _ in range(20):
            await http.get("/v1/nothing-here")
        before = cpu_sec(server)
        for _ in range(requests):
            assert (await http.get("/v1/nothing-here")).status_code == 404
        return (cpu_sec(server) - before) * 1000 / requests


async def heartbeat_ms(base: str, token: str, server: psutil.Process, beats: int = 1000) -> float:
    """The server's CPU for an idle node's heartbeat (what every online node sends every
    `heartbeat_interval_sec`)."""
    agent = SimulatedAgent(base)
    await agent.register(token)
    for _ in range(20):
        await agent.heartbeat([])
    before = cpu_sec(server)
    for _ in range(beats):
        await agent.heartbeat([])
    spent = cpu_sec(server) - before
    await agent.aclose()
    return spent * 1000 / beats


async def enqueue_latency(
    base: str, token: str, tenant: dict[str, str], samples: int
) -> list[float]:
    agent = SimulatedAgent(base)
    await agent.register(token)
    latencies = []
    async with httpx.AsyncClient(base_url=base, headers=tenant, timeout=30) as http:
        for _ in range(samples):
            waiting = asyncio.create_task(agent.lease(slots=1, wait=25))
            await asyncio.sleep(0.02)  # the long-poll is parked on the server
            start = time.perf_counter()
            response = await http.post("/v1/gpu/invoke", json=CPU_BODY)
            assert response.status_code == 202
            (job,) = await waiting
            latencies.append((time.perf_counter() - start) * 1000)
            await agent.complete(job)
    await agent.aclose()
    return latencies


async def end_to_end(
    base: str, token: str, tenant: dict[str, str], tmp: Path, samples: int, gap: float = 0.0
) -> dict[str, list[float]]:
    """Three ways, interleaved sample by sample so each sees the same machine: the tenant
    asks with `Prefer: wait` (one request), submits then long-polls with `?wait=` (two),
    and the floor (onnxruntime in-process, the model loaded per call, plus one HTTP
    round trip to the same server). `gap`: seconds between one invoke and the next (0:
    back to back, each job finding the sandbox the last one left still starting; 0.5: a
    tenant calling now and then, the agent settled between calls)."""
    import onnxruntime as ort

    agent = AgentProcess(base, token, tmp / "agent", sandbox="bwrap")
    try:
        async with httpx.AsyncClient(base_url=base, headers=tenant, timeout=60) as http:
            urls = {}
            for kind, path in (("model", DIGITS_MODEL), ("inputs", DIGITS_INPUTS)):
                data = path.read_bytes()
                r = await http.post(
                    "/v1/artifacts",
                    params={"kind": kind, "content_sha256": hashlib.sha256(data).hexdigest()},
                    content=data,
                )
                urls[kind] = r.json()["url"]
            body = {
                "runtime": "onnx_cpu",
                "model_url": urls["model"],
                "inputs_url": urls["inputs"],
                "timeout_sec": 60,
            }

            def agent_alive() -> None:
                """The bench's nodes are online too: a dead agent would leave these
                invokes queued forever."""
                if agent.process.poll() is not None:
                    raise RuntimeError(f"the agent exited:\n{agent.log_path.read_text()[-3000:]}")

            async def submit(headers: dict[str, str]) -> httpx.Response:
                for _ in range(100):  # until the agent is online
                    r = await http.post("/v1/gpu/invoke", json=body, headers=headers)
                    if r.status_code != 503:
                        return r
                    await asyncio.sleep(0.1)
                raise RuntimeError(f"no node took the invoke: {r.text}")

            async def preferred() -> dict[str, Any]:
                state: dict[str, Any] = (await submit({"Prefer": "wait=30"})).json()
                while state["status"] in ("queued", "assigned", "running"):
                    agent_alive()
                    state = (await http.get(f"/v1/gpu/invokes/{state['id']}?wait=30")).json()
                return state

            async def polled() -> dict[str, Any]:
                state: dict[str, Any] = (await submit({})).json()
                while True:  # long-poll: answered when the invoke is final
                    agent_alive()
                    state = (await http.get(f"/v1/gpu/invokes/{state['id']}?wait=30")).json()
                    if state["status"] not in ("queued", "assigned", "running"):
                        return state

            async def floor() -> None:
                session = ort.InferenceSession(
                    str(DIGITS_MODEL), providers=["CPUExecutionProvider"]
                )
                session.run(None, inputs)
                await http.get("/health")

            inputs = dict(np.load(DIGITS_INPUTS))
            timings: dict[str, list[float]] = {"prefer": [], "poll": [], "floor": []}
            metrics: list[dict[str, Any]] = []
            await preferred()  # the first run fills the cache
            ways = [("prefer", preferred), ("poll", polled), ("floor", floor)]
            for i in range(samples):
                # The order turns each sample, so no way always follows the same one
                # (a warm sandbox still refilling after the last job, say).
                for name, way in ways[i % 3 :] + ways[: i % 3]:
                    await asyncio.sleep(gap)
                    start = time.perf_counter()
                    state = await way()
                    timings[name].append((time.perf_counter() - start) * 1000)
                    if state is not None:
                        assert state["status"] == "done", state
                        metrics.append(state["result"]["metrics"])
            warm = agent.log_path.read_text().count("runs in a warm sandbox")
            print(f"    (c) {warm} of {2 * samples + 1} invokes ran in a warm sandbox; p50 of")
            for name in sorted(metrics[0]):
                values = [m[name] for m in metrics if isinstance(m.get(name), int | float)]
                if values and name.endswith("_ms"):
                    print(f"        {name}: {statistics.median(values):.0f}")
    finally:
        agent.stop()
    return timings


async def ledger_postings(dsn: str) -> dict[str, int]:
    """How many ledger transactions of each kind the runs posted: a priced job posts its
    reserve and its settlement, a free one nothing."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT kind, count(*) AS n FROM ledger_transactions GROUP BY kind")
    finally:
        await conn.close()
    return {row["kind"]: row["n"] for row in rows}


async def accounts(http: httpx.AsyncClient, *, priced: bool) -> tuple[str, str]:
    """The bench's tenant key and provider enrollment token (`http` speaks as the admin);
    `priced`: the provider prices CPU work and the tenant has money, so that every job
    posts its reserve and its settlement to the ledger, as a paid job does."""
    tenant = (
        await http.post("/v1/admin/tenants", json={"name": "bench", "email": "b@example.com"})
    ).json()
    provider = (
        await http.post("/v1/admin/providers", json={"name": "bench", "email": "p@example.com"})
    ).json()
    if priced:
        price = await http.put(
            "/v1/provider/prices/cpu",
            json={"price_per_gpu_hour": "0.36", "spot_discount_pct": 40},
            headers={"Authorization": f"Bearer {provider['api_key']}"},
        )
        top_up = await http.post(
            f"/v1/admin/tenants/{tenant['id']}/top-ups",
            json={"amount": "1000000", "reference": "bench"},
        )
        if price.status_code != 200 or top_up.status_code not in (200, 201):
            raise SystemExit(f"pricing failed: {price.text} {top_up.text}")
    return tenant["api_key"], provider["enrollment_token"]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--e2e-samples", type=int, default=20)
    parser.add_argument(
        "--e2e-gap", type=float, default=0.0, help="seconds between invokes in (c); 0: back to back"
    )
    parser.add_argument(
        "--priced",
        action="store_true",
        help="the provider prices CPU work and the tenant holds a balance: every job reserves"
        " at its submit and is settled through the ledger at its result (else all is free)",
    )
    args = parser.parse_args()

    url = await create_scratch_postgres("gpushare_bench")
    dsn = url.replace("postgresql+asyncpg", "postgresql")
    admin_key = "gpu_admin_" + secrets.token_urlsafe(24)
    port, minimal_port = free_port(), free_port()
    base, minimal_base = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{minimal_port}"
    minimal_key = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp_name:
        tmp = Path(tmp_name)
        server = subprocess.Popen(
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
                "GPUSHARE_DATABASE_URL": url,
                "GPUSHARE_DATA_DIR": str(tmp / "data"),
                "GPUSHARE_ADMIN_KEY": admin_key,
            },
            cwd=ROOT,
        )
        minimal_app = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.minimal_dispatch_app:app",
                "--port",
                str(minimal_port),
                "--log-level",
                "warning",
            ],
            env={**os.environ, "BENCH_DSN": dsn, "BENCH_KEY": minimal_key},
            cwd=ROOT,
        )
        try:
            await wait_healthy(base)
            await wait_healthy(minimal_base)
            async with httpx.AsyncClient(
                base_url=base, headers={"Authorization": f"Bearer {admin_key}"}
            ) as http:
                tenant_key, token = await accounts(http, priced=args.priced)
            tenant = {"Authorization": f"Bearer {tenant_key}"}

            process = psutil.Process(server.pid)
            minimal = (minimal_base, minimal_key, psutil.Process(minimal_app.pid))
            bare, ways = await throughputs(
                base, token, tenant, dsn, args.jobs, args.agents, args.rounds, process, minimal
            )
            three, fast, ours = ways["three"], ways["fast"], ways["next"]
            lean = ways["minimal"]
            postings = await ledger_postings(dsn)
            floor_ms = await request_floor_ms(base, process)
            beat_ms = await heartbeat_ms(base, token, process)
            latencies = await enqueue_latency(base, token, tenant, args.latency_samples)
            e2e = (
                await end_to_end(base, token, tenant, tmp, args.e2e_samples, args.e2e_gap)
                if args.e2e_samples
                else None
            )
        finally:
            for started in (server, minimal_app):
                started.terminate()
                started.wait()
            await drop_scratch_postgres(url)

    print(
        f"(a) lease throughput, {args.agents} agents, {args.jobs} jobs in {args.rounds} rounds"
        " (the order turning), one per lease:"
    )
    for label, run in (
        ("result brings the next", ours),
        ("fast path (2 requests)", fast),
        ("lease + start + result", three),
    ):
        print(
            f"    ours, {label}: {run.jobs_per_sec:6.0f} jobs/s,"
            f" ÷ minimal app {run.jobs_per_sec / lean.jobs_per_sec:.2f},"
            f" ÷ bare loop {run.jobs_per_sec / bare:.2f};"
            f" server CPU per job {run.cpu_ms:5.1f} ms (submit {run.submit_cpu_ms:.1f},"
            f" lease + result {run.drain_cpu_ms:.1f})"
        )
    print(
        f"    minimal Starlette + asyncpg app, result brings the next: {lean.jobs_per_sec:6.0f}"
        f" jobs/s, ÷ bare loop {lean.jobs_per_sec / bare:.2f}; its CPU per job"
        f" {lean.cpu_ms:5.1f} ms (submit {lean.submit_cpu_ms:.1f},"
        f" lease + result {lean.drain_cpu_ms:.1f})"
    )
    print(f"    bare SKIP LOCKED loop:         {bare:8.0f} jobs/s")
    print(
        f"    ours {'priced' if args.priced else 'free (--priced: paid jobs)'}; ledger postings"
        f" by kind: {postings or 'none'}"
    )
    print(f"    server CPU of a request that does no work (a 404): {floor_ms:.2f} ms")
    print(f"    server CPU of an idle node's heartbeat: {beat_ms:.2f} ms")
    if args.latency_samples:
        print(f"(b) enqueue-to-agent latency, idle long-polling agent, {len(latencies)} samples:")
        p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
        print(f"    p50 {p50:.1f} ms   p99 {p99:.1f} ms   (target p50 <= 5 ms)")
    if e2e is None:
        return
    floor = statistics.median(e2e["floor"])
    spacing = f"{args.e2e_gap:g} s apart" if args.e2e_gap else "back to back"
    print(
        f"(c) end-to-end digits invoke, warm cache, {len(e2e['floor'])} samples, interleaved,"
        f" {spacing}:"
    )
    for name, label in (
        ("prefer", "ours, Prefer: wait (1 request)"),
        ("poll", "ours, submit + ?wait= (2 requests)"),
    ):
        p50, p99 = statistics.median(e2e[name]), percentile(e2e[name], 0.99)
        print(f"    {label:>36}: p50 {p50:5.0f} ms  p99 {p99:5.0f} ms  ratio {p50 / floor:5.1f}")
    print(f"    {'in-process onnxruntime + 1 HTTP RTT':>36}: p50 {floor:5.1f} ms  (target ≤ 3×)")


if __name__ == "__main__":
    asyncio.run(main())
