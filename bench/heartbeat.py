"""Heartbeat: the server's CPU for one node's heartbeat, this source tree against another.

Every online node sends a heartbeat every `heartbeat_interval_sec` (5 s): at 1,000 idle
agents this is what keeps a coordinator process busy (`scale.py`). Two `gpu-share
server` processes on two scratch PostgreSQL databases: "ours" from this tree, "before"
from `--before DIR` (e.g. the committed code: `git archive HEAD src | tar -x -C
/tmp/before`). In rounds whose order turns, each gets 1,000 heartbeats from an idle
node, 1,000 from a node holding one running lease, and 1,000 requests that touch no
database (a 404 under /v1/: what any request costs the server). No hardware challenge
is issued unless `--challenges` (then one waits in every beat's answer, as for a node that
never starts it). Printed: the server CPU per request in each round, and the median
over the rounds of ours ÷ before.

Run: .venv/bin/python bench/heartbeat.py --before /tmp/before/src [--rounds 5] [--beats 1000]
"""

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from dispatch import CPU_BODY, cpu_sec, wait_healthy

from gpu_share.testing.databases import create_scratch_postgres, drop_scratch_postgres
from gpu_share.testing.servers import free_port
from gpu_share.testing.simulated_agent import SimulatedAgent

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Side:
    name: str
    base: str
    process: psutil.Process
    idle: SimulatedAgent | None = None
    busy: SimulatedAgent | None = None
    busy_jobs: list = field(default_factory=list)  # type: ignore[type-arg]
    figures: dict[str, list[float]] = field(default_factory=dict)


def start_server(
    port: int, url: str, data: Path, admin_key: str, src: str | None, *, challenges: bool
) -> subprocess.Popen:  # type: ignore[type-arg]
    env = {
        **os.environ,
        "GPUSHARE_DATABASE_URL": url,
        "GPUSHARE_DATA_DIR": str(data),
        "GPUSHARE_ADMIN_KEY": admin_key,
        # The lease must outlive the rounds: the busy node's job is never reported.
        "GPUSHARE_LEASE_TTL_SEC": "3600",
    }
    if not challenges:
        # A node that answered its challenges has none waiting. These nodes never answer
        # one, so from the first issue (30 s in) every beat would carry it.
        env["GPUSHARE_CHALLENGE_INTERVAL_SEC"] = "86400"
    if src is not None:
        env["PYTHONPATH"] = src
    command = [sys.executable, "-m", "gpu_share.cli.main", "server", "--port", str(port)]
    return subprocess.Popen([*command, "--log-level", "warning"], env=env, cwd=ROOT)


async def furnish(side: Side, admin_key: str) -> None:
    """A tenant, a provider, an idle node and a node holding one started lease."""
    async with httpx.AsyncClient(
        base_url=side.base, headers={"Authorization": f"Bearer {admin_key}"}
    ) as http:
        tenant_key = (
            await http.post("/v1/admin/tenants", json={"name": "bench", "email": "b@example.com"})
        ).json()["api_key"]
        token = (
            await http.post("/v1/admin/providers", json={"name": "bench", "email": "p@example.com"})
        ).json()["enrollment_token"]
    side.idle, side.busy = SimulatedAgent(side.base), SimulatedAgent(side.base)
    await side.idle.register(token)
    await side.busy.register(token)
    await side.busy.heartbeat([])
    async with httpx.AsyncClient(
        base_url=side.base, headers={"Authorization": f"Bearer {tenant_key}"}
    ) as http:
        response = await http.post("/v1/gpu/invoke", json=CPU_BODY)
        assert response.status_code == 202, response.text
    side.busy_jobs = await side.busy.lease(slots=1, wait=5, start=True)
    assert len(side.busy_jobs) == 1, "the busy node got no job"


async def per_request_ms(side: Side, send: Callable[[], Awaitable[object]], count: int) -> float:
    for _ in range(20):
        await send()
    before = cpu_sec(side.process)
    for _ in range(count):
        await send()
    return (cpu_sec(side.process) - before) * 1000 / count


async def round_of(side: Side, beats: int, http: httpx.AsyncClient) -> None:
    assert side.idle is not None and side.busy is not None
    idle, busy, jobs = side.idle, side.busy, side.busy_jobs

    async def busy_beat() -> None:
        ack = await busy.heartbeat(jobs)
        assert ack.leases[0].verdict == "keep", ack

    async def nothing() -> None:
        assert (await http.get("/v1/nothing-here")).status_code == 404

    for name, send in (
        ("idle heartbeat", lambda: idle.heartbeat([])),
        ("heartbeat with a running lease", busy_beat),
        ("a 404 (no database)", nothing),
    ):
        side.figures.setdefault(name, []).append(await per_request_ms(side, send, beats))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="a source tree's src folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--beats", type=int, default=1000)
    parser.add_argument(
        "--challenges",
        action="store_true",
        help="issue hardware challenges (never answered: each beat then carries one)",
    )
    args = parser.parse_args()

    admin_key = "gpu_admin_" + secrets.token_urlsafe(24)
    urls = [await create_scratch_postgres("gpushare_bench") for _ in range(2)]
    servers: list[subprocess.Popen] = []  # type: ignore[type-arg]
    sides: list[Side] = []
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        try:
            for (name, src), url in zip(
                (("ours", None), ("before", args.before)), urls, strict=True
            ):
                port = free_port()
                server = start_server(
                    port, url, Path(tmp) / name, admin_key, src, challenges=args.challenges
                )
                servers.append(server)
                sides.append(Side(name, f"http://127.0.0.1:{port}", psutil.Process(server.pid)))
            for side in sides:
                await wait_healthy(side.base)
                await furnish(side, admin_key)
            for number in range(args.rounds):
                order = sides if number % 2 == 0 else sides[::-1]
                for side in order:
                    async with httpx.AsyncClient(base_url=side.base) as http:
                        await round_of(side, args.beats, http)
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait(timeout=30)
            for url in urls:
                await drop_scratch_postgres(url)

    ours, before = sides
    print(f"server CPU per request, ms ({args.rounds} rounds of {args.beats}; ours / before):")
    for name in ours.figures:
        pairs = list(zip(ours.figures[name], before.figures[name], strict=True))
        rounds = "  ".join(f"{mine:.2f}/{theirs:.2f}" for mine, theirs in pairs)
        ratio = statistics.median(mine / theirs for mine, theirs in pairs)
        print(f"  {name:32s} median ratio {ratio:.2f}   rounds: {rounds}")


if __name__ == "__main__":
    asyncio.run(main())
