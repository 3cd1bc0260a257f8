"""Our platform against its peers, side by side in one run (issue: peers benchmark).

On loopback, with the same models, the same NPZ bodies and the same onnxruntime
intra-op thread count everywhere (the agent's: this machine's cores over its one slot):

  (1) an isolated invoke of the digits example, warm cache, from submit to the output
      arrays decoded in the client. Ours: `POST /v1/gpu/invoke` and the long-poll
      `GET /v1/gpu/invokes/{id}?wait=`, `gpu-share server` on a scratch PostgreSQL and a
      real agent process (bwrap). Baselines: Celery + Redis, a prefork worker of
      concurrency 1, (a) opening the model afresh for each task, the fair peer of an
      isolated invoke, and (b) holding it loaded. Targets: ours ≤ 3× (a), ≤ 5× (b).
  (2) the coordinator's CPU per invoke while the tenant waits with `?wait=`: CPU seconds
      of the `gpu-share server` process over the rounds of (1) over their invokes.
      Target ≤ 10 ms.
  (3) session forwards, SqueezeNet 1.1 (built by bench/peers/squeezenet.py) and digits:
      ours (`POST /v1/gpu/sessions/{id}/forward`) against a Ray Serve deployment that
      holds the model, reached over HTTP with the same NPZ body and answering NPZ.
      Targets for SqueezeNet: ours / Ray ≤ 0.5 at p50 and ≤ 1.0 at p99.

Rounds interleave the sides, the order rotating each round, so drift hits all alike. The
Celery worker and Redis run during (1) only, Ray during (3) only: an idle peer's
background work would otherwise land on the other sides' two cores.

Needs bench/peers/.venv (bench/peers/setup.sh). Run from the repository root:
  bench/peers/.venv/bin/python bench/peers/run.py [--rounds 5] [--invokes 20] [--forwards 40]
      [--think-ms 0] [--sqlite] [--logs bench/.out/peers]
"""

import argparse
import asyncio
import base64
import hashlib
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celery_app
import httpx
import numpy as np
import psutil
import redis
from fleet import Fleet, descendants, reap
from inference import decode_npz, npz_bytes, open_session, run_npz
from squeezenet import cached_squeezenet, sample_input

from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.databases import create_scratch_postgres, drop_scratch_postgres
from gpu_share.testing.processes import AgentProcess
from gpu_share.testing.servers import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SLOTS = 1  # the agent's; it gives a job or a session its cores over its slots
RUNNING = ("queued", "assigned", "running")

Sample = Callable[[], dict[str, np.ndarray]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(sample: Sample, n: int, into: list[float], think: float = 0) -> None:
    for _ in range(n):
        time.sleep(think)  # the client's pause between requests, not timed
        start = time.perf_counter()
        outputs = sample()
        into.append((time.perf_counter() - start) * 1000)
        assert outputs, "no outputs"


def interleave(
    sides: dict[str, Sample], rounds: int, per_round: int, think: float = 0
) -> dict[str, list[float]]:
    names = list(sides)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            timed(sides[name], per_round, times[name], think)
    return times


def wait_for(what: str, ready: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (httpx.TransportError, redis.ConnectionError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not come up in {timeout:.0f} s")


class Ours:
    """A tenant of `gpu-share server` with a real agent process behind it."""

    def __init__(self, base: str, tenant_key: str) -> None:
        self.http = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {tenant_key}"}, timeout=120
        )
        self.busy = 0  # submits answered 503, retried

    def upload(self, kind: str, data: bytes) -> str:
        r = self.http.post(
            "/v1/artifacts",
            params={"kind": kind, "content_sha256": hashlib.sha256(data).hexdigest()},
            content=data,
        )
        r.raise_for_status()
        url: str = r.json()["url"]
        return url

    def invoke(self, body: dict[str, Any], metrics: list[dict[str, Any]]) -> Sample:
        def sample() -> dict[str, np.ndarray]:
            deadline = time.monotonic() + 60
            while True:  # 503: no node free yet (starting, or handing its slot back)
                r = self.http.post("/v1/gpu/invoke", json=body)
                if r.status_code != 503 or time.monotonic() > deadline:
                    break
                self.busy += 1
                time.sleep(0.01)
            assert r.status_code == 202, r.text
            invoke_id = r.json()["id"]
            state = r.json()
            while state["status"] in RUNNING:
                state = self.http.get(f"/v1/gpu/invokes/{invoke_id}", params={"wait": 30}).json()
            assert state["status"] == "done", state
            result = state["result"]
            metrics.append(result["metrics"])
            if result["outputs_inline_base64"] is not None:
                return decode_npz(base64.b64decode(result["outputs_inline_base64"]))
            return decode_npz(self.http.get(result["outputs_url"]).content)

        return sample

    def open_session(self, model_url: str) -> str:
        for _ in range(300):
            r = self.http.post(
                "/v1/gpu/sessions", json={"runtime": "onnx_cpu", "model_url": model_url}
            )
            if r.status_code == 201:
                break
            time.sleep(0.1)
        assert r.status_code == 201, r.text
        session_id: str = r.json()["id"]
        wait_for(
            f"session {session_id}",
            lambda: self.http.get(f"/v1/gpu/sessions/{session_id}").json()["status"] == "ready",
        )
        return session_id

    def forward(self, session_id: str, body: bytes) -> Sample:
        url = f"/v1/gpu/sessions/{session_id}/forward"
        headers = {"Content-Type": "application/octet-stream"}

        def sample() -> dict[str, np.ndarray]:
            r = self.http.post(url, content=body, headers=headers)
            assert r.status_code == 200, r.text
            return decode_npz(r.content)

        return sample


def celery_task(name: str, model: Path, body: bytes) -> Sample:
    app = celery_app.app

    def sample() -> dict[str, np.ndarray]:
        return decode_npz(app.send_task(name, args=[str(model), body]).get(timeout=120))

    return sample


def http_forward(http: httpx.Client, url: str, body: bytes) -> Sample:
    def sample() -> dict[str, np.ndarray]:
        r = http.post(url, content=body, headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 200, r.text
        return decode_npz(r.content)

    return sample


def in_process(session: Any, body: bytes) -> Sample:
    """The floor of a forward: what every side does with the body, without moving it."""
    return lambda: decode_npz(run_npz(session, body))


class CpuMeter:
    """CPU seconds that processes (and the children they reaped) spend while samples run."""

    def __init__(self, processes: dict[str, psutil.Process]) -> None:
        self.processes = processes
        self.seconds = dict.fromkeys(processes, 0.0)
        self.samples = 0

    @staticmethod
    def _now(process: psutil.Process) -> float:
        t = process.cpu_times()
        return float(t.user + t.system + t.children_user + t.children_system)

    def around(self, sample: Sample) -> Sample:
        def counted() -> dict[str, np.ndarray]:
            before = {name: self._now(p) for name, p in self.processes.items()}
            outputs = sample()
            for name, process in self.processes.items():
                self.seconds[name] += self._now(process) - before[name]
            self.samples += 1
            return outputs

        return counted

    def ms_per_sample(self, name: str) -> float:
        return self.seconds[name] / self.samples * 1000


@dataclass
class InvokeFigures:
    times: dict[str, list[float]]
    cpu: CpuMeter
    metrics: list[dict[str, Any]]  # our jobs' own, from their results
    busy: int  # our submits answered 503 and retried


def start_ours(fleet: Fleet, tmp: Path, database_url: str | None) -> tuple[str, str, str, int]:
    """The server; its base URL, a tenant key, an enrollment token and its pid."""
    admin = "gpu_admin_" + secrets.token_urlsafe(24)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {"GPUSHARE_DATA_DIR": str(tmp / "data"), "GPUSHARE_ADMIN_KEY": admin}
    if database_url:
        env["GPUSHARE_DATABASE_URL"] = database_url
    argv = [sys.executable, "-m", "gpu_share.cli.main", "server", "--port", str(port)]
    server = fleet.start("server", [*argv, "--log-level", "warning"], env=env, cwd=ROOT)
    wait_for("gpu-share server", lambda: httpx.get(f"{base}/health").status_code == 200)
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}) as http:
        tenant = http.post("/v1/admin/tenants", json={"name": "bench", "email": "b@example.com"})
        provider = http.post(
            "/v1/admin/providers", json={"name": "bench", "email": "p@example.com"}
        )
    return base, tenant.json()["api_key"], provider.json()["enrollment_token"], server.pid


def measure_invokes(
    fleet: Fleet, ours: Ours, cpu: CpuMeter, tmp: Path, args: argparse.Namespace
) -> InvokeFigures:
    redis_port = free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    redis_server = fleet.start(
        "redis",
        [
            *("redis-server", "--port", str(redis_port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", str(tmp)),
        ],
    )
    wait_for("redis-server", lambda: bool(redis.Redis(port=redis_port).ping()))
    worker = fleet.start(
        "celery",
        [
            *(sys.executable, str(HERE / "celery_app.py")),
            *("--redis-url", redis_url, "--threads", str(args.threads)),
        ],
        env={"PYTHONPATH": str(HERE)},
        cwd=HERE,
    )
    celery_app.configure(redis_url)
    try:
        body = {
            "runtime": "onnx_cpu",
            "model_url": ours.upload("model", DIGITS_MODEL.read_bytes()),
            "inputs_url": ours.upload("inputs", DIGITS_INPUTS.read_bytes()),
            "timeout_sec": 60,
        }
        digits_body = DIGITS_INPUTS.read_bytes()
        metrics: list[dict[str, Any]] = []
        ours_invoke = ours.invoke(body, metrics)
        sides = {
            "ours": cpu.around(ours_invoke),
            "celery_fresh": celery_task("peers.infer_fresh", DIGITS_MODEL, digits_body),
            "celery_held": celery_task("peers.infer_held", DIGITS_MODEL, digits_body),
        }
        warm_up = {"ours": ours_invoke, **{k: v for k, v in sides.items() if k != "ours"}}
        for sample in warm_up.values():  # caches, the warm sandbox, the worker's import
            timed(sample, 3, [])
        metrics.clear()
        ours.busy = 0
        times = interleave(sides, args.rounds, args.invokes, args.think_ms / 1000)
    finally:
        fleet.stop(worker)
        fleet.stop(redis_server)
    return InvokeFigures(times, cpu, metrics, ours.busy)


def measure_forwards(
    fleet: Fleet, ours: Ours, tmp: Path, squeezenet: Path, args: argparse.Namespace
) -> dict[str, dict[str, list[float]]]:
    bodies = {"squeezenet": npz_bytes(data=sample_input()), "digits": DIGITS_INPUTS.read_bytes()}
    models = {"squeezenet": squeezenet, "digits": DIGITS_MODEL}
    ray_port = free_port()
    ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths are short
    ray = fleet.start(
        "ray",
        [
            *(sys.executable, str(HERE / "ray_app.py"), "--port", str(ray_port)),
            *("--threads", str(args.threads), "--cpus", str(os.cpu_count() or 1)),
            *("--temp-dir", str(ray_dir)),
            *(f"--model={name}={path}" for name, path in models.items()),
        ],
        env={"RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(HERE)},
        cwd=HERE,
    )
    try:
        sessions = {
            name: ours.open_session(ours.upload("model", path.read_bytes()))
            for name, path in models.items()
        }
        wait_for("ray serve", lambda: fleet.said(ray, "ready"), timeout=300)
        results = {}
        with httpx.Client(base_url=f"http://127.0.0.1:{ray_port}", timeout=120) as http:
            for name, body in bodies.items():
                sides = {
                    "ours": ours.forward(sessions[name], body),
                    "ray": http_forward(http, f"/{name}", body),
                    "floor": in_process(open_session(models[name], args.threads), body),
                }
                for sample in sides.values():
                    timed(sample, 10, [])
                results[name] = interleave(sides, args.rounds, args.forwards)
        for session_id in sessions.values():
            ours.http.delete(f"/v1/gpu/sessions/{session_id}")
    finally:
        fleet.stop(ray, timeout=60)
        shutil.rmtree(ray_dir, ignore_errors=True)
    return results


def line(label: str, values: list[float]) -> str:
    p50, p99 = statistics.median(values), percentile(values, 0.99)
    return f"    {label:<44} p50 {p50:8.2f}   p99 {p99:8.2f}"


def ratio(label: str, ours: list[float], peer: list[float], targets: str) -> str:
    p50 = statistics.median(ours) / statistics.median(peer)
    p99 = percentile(ours, 0.99) / percentile(peer, 0.99)
    return f"    {label:<44} p50 {p50:8.2f}   p99 {p99:8.2f}   ({targets})"


def report(
    invokes: InvokeFigures, forwards: dict[str, dict[str, list[float]]], args: argparse.Namespace
) -> None:
    print(f"onnxruntime intra-op threads on every side: {args.threads}; times in ms")
    times = invokes.times
    n = len(times["ours"])
    apart = f", {args.think_ms:.0f} ms apart" if args.think_ms else ", back to back"
    print(f"(1) isolated invoke, digits (8 rows), warm cache, submit → outputs decoded{apart}:")
    print(f"    {n} each")
    print(line("ours (invoke + ?wait= long-poll, bwrap)", times["ours"]))
    print(line("Celery + Redis, model loaded per task (a)", times["celery_fresh"]))
    print(line("Celery + Redis, model held by the worker (b)", times["celery_held"]))
    print(ratio("ours / (a)", times["ours"], times["celery_fresh"], "target p50 <= 3"))
    print(ratio("ours / (b)", times["ours"], times["celery_held"], "target p50 <= 5"))
    where = []
    for name in sorted({k for m in invokes.metrics for k in m if k.endswith("_ms")}):
        values = [m[name] for m in invokes.metrics if isinstance(m.get(name), int | float)]
        if values:
            where.append(f"{name} {statistics.median(values):.0f}")
    print(f"    ours, p50 of the jobs' own metrics: {', '.join(where)}")
    print(f"    ours, submits answered 503 (node busy) and retried: {invokes.busy}")
    server_ms = invokes.cpu.ms_per_sample("server")
    print(f"(2) coordinator CPU per invoke with ?wait=: {server_ms:.1f} ms   (target <= 10 ms)")
    agent_ms = invokes.cpu.ms_per_sample("agent")
    print(f"    for comparison, the agent with its jobs' processes: {agent_ms:.1f} ms")
    for name, pair in forwards.items():
        print(f"(3) session forward, {name}, {len(pair['ours'])} each:")
        print(line("ours (session forward)", pair["ours"]))
        print(line("Ray Serve (deployment holding the model)", pair["ray"]))
        print(line("floor: in the bench's process, no HTTP", pair["floor"]))
        targets = "target p50 <= 0.5, p99 <= 1.0" if name == "squeezenet" else "no target"
        print(ratio("ours / Ray Serve", pair["ours"], pair["ray"], targets))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--invokes", type=int, default=20, help="invokes per side per round")
    parser.add_argument("--forwards", type=int, default=40, help="forwards per side per round")
    parser.add_argument(
        "--think-ms",
        type=float,
        default=0,
        help="pause before each invoke of (1), every side, not timed (0: back to back)",
    )
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) // SLOTS))
    parser.add_argument("--sqlite", action="store_true", help="SQLite instead of PostgreSQL")
    parser.add_argument(
        "--logs", type=Path, default=ROOT / "bench/.out/peers", help="the processes' logs"
    )
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so that the `finally` below stops every process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    squeezenet = cached_squeezenet()
    database_url = None if args.sqlite else asyncio.run(create_scratch_postgres("gpushare_peers"))
    tmp = Path(tempfile.mkdtemp(prefix="gpushare-peers-"))
    fleet = Fleet(args.logs)
    agent: AgentProcess | None = None
    ours: Ours | None = None
    try:
        base, tenant_key, token, server_pid = start_ours(fleet, tmp, database_url)
        agent = AgentProcess(
            base,
            token,
            tmp / "agent",
            sandbox="bwrap",
            env={"GPUSHARE_AGENT_JOB_THREADS": str(args.threads)},
        )
        ours = Ours(base, tenant_key)
        cpu = CpuMeter(
            {"server": psutil.Process(server_pid), "agent": psutil.Process(agent.process.pid)}
        )
        invokes = measure_invokes(fleet, ours, cpu, tmp, args)
        forwards = measure_forwards(fleet, ours, tmp, squeezenet, args)
    finally:
        if ours is not None:
            ours.http.close()
        if agent is not None:
            family = descendants(agent.process.pid)
            agent.stop()
            reap(agent.process.pid, [p for p in family if p.is_running()])
        fleet.stop_all()
        if database_url:
            asyncio.run(drop_scratch_postgres(database_url))
        if (tmp / "agent/agent.log").exists():
            shutil.copy(tmp / "agent/agent.log", args.logs / "agent.log")
        shutil.rmtree(tmp, ignore_errors=True)
    report(invokes, forwards, args)


if __name__ == "__main__":
    main()
