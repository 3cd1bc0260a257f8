"""The agent's main loop: register → heartbeat → lease → run jobs → report.

Shaped like procrastinate's worker: a heartbeat side task, a lease loop bounded by
free slots, and a graceful stop that lets running jobs finish for a while.
"""

import asyncio
import contextlib
import json
import logging
import os
import platform
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import psutil

from gpu_share import logs
from gpu_share._version import __version__
from gpu_share.agent import gpu as gpu_module
from gpu_share.agent.benchmarks.schedule import BenchmarkSchedule
from gpu_share.agent.benchmarks.suite import BenchmarkSuite
from gpu_share.agent.cache import ArtifactCache
from gpu_share.agent.capabilities import detect_runtimes
from gpu_share.agent.challenges.answering import ChallengeAnswerer
from gpu_share.agent.client import (
    CoordinatorClient,
    CoordinatorError,
    Unauthorized,
    describe,
    is_transient,
)
from gpu_share.agent.fingerprint import machine_fingerprint
from gpu_share.agent.gpu import Gpu, Nvml
from gpu_share.agent.jobcontext import JobContext, job_limits
from gpu_share.agent.jobs import Job
from gpu_share.agent.sandbox import Sandbox, detect_sandbox
from gpu_share.agent.sessions import SessionHost
from gpu_share.agent.settings import AgentSettings
from gpu_share.agent.warm import WarmPool, node_keys
from gpu_share.backoff import Backoff
from gpu_share.netguard import SafeFetcher, UrlPolicy
from gpu_share.protocol import agent as wire
from gpu_share.protocol.benchmarks import BenchmarkReport, BenchmarkRun
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.trust import ChallengeKind, ChallengeOrder

log = logging.getLogger(__name__)

REPORT_GRACE_SEC = 5.0  # at stop, how long a result already on its way may take to arrive


class AgentStartError(Exception):
    """The agent cannot start: say what to fix."""


UNISOLATED_REFUSED = (
    "{why}: jobs would run as plain processes that could reach the network and read this "
    "agent's key; install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`) or Docker, "
    "or pass --allow-unisolated (GPUSHARE_AGENT_ALLOW_UNISOLATED=1) to serve other people's "
    "jobs unisolated anyway"
)


def choose_sandbox(settings: AgentSettings) -> Sandbox:
    """The sandbox jobs run in; an unisolated one only when the provider opted in.

    The coordinator shows such a node to tenants as not isolated, and `isolated_only`
    keeps their work off it; `gpu-share up`, where the jobs are the owner's own, opts in.
    """
    if settings.sandbox == "process" and not settings.allow_unisolated:
        raise AgentStartError(
            UNISOLATED_REFUSED.format(why="the process sandbox does not isolate jobs")
        )
    sandbox = detect_sandbox(settings.sandbox, docker_image=settings.docker_image)
    if not sandbox.isolated and not settings.allow_unisolated:
        raise AgentStartError(
            UNISOLATED_REFUSED.format(why="neither Docker nor bubblewrap works here")
        )
    return sandbox


@dataclass
class Identity:
    server: str
    node_id: str
    node_key: str


def load_identity(path: Path, server: str) -> Identity | None:
    try:
        data = json.loads(path.read_text())
        identity = Identity(**data)
    except (FileNotFoundError, ValueError, TypeError):
        return None
    return identity if identity.server == server else None


def save_identity(path: Path, identity: Identity) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(identity.__dict__, f)


class CoordinatorUplink:
    """The agent's client as the benchmarks take it (`benchmarks.uplink.Uplink`): its
    benchmark calls, and what its failures mean."""

    def __init__(self, client: CoordinatorClient) -> None:
        self.client = client

    async def report_benchmark(self, report: BenchmarkReport) -> BenchmarkRun:
        return await self.client.report_benchmark(report)

    async def benchmark_ping(self) -> None:
        await self.client.benchmark_ping()

    async def benchmark_download(self, nbytes: int, seconds: float) -> int:
        return await self.client.benchmark_download(nbytes, seconds)

    async def benchmark_upload(self, nbytes: int, seconds: float) -> int:
        return await self.client.benchmark_upload(nbytes, seconds)

    def describe(self, exc: BaseException) -> str:
        return describe(exc)

    def refused(self, exc: BaseException) -> bool:
        return isinstance(exc, CoordinatorError) and not is_transient(exc)


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        sandbox: Sandbox | None = None,
        nvml: Nvml | None = None,
        runtimes: list[RuntimeName] | None = None,
        benchmark_suite: BenchmarkSuite | None = None,
    ) -> None:
        self.settings = settings
        self.client = CoordinatorClient(settings.server, transport=transport)
        self.nvml = nvml or Nvml()
        self.gpus: list[Gpu] = self.nvml.discover()
        self.gpu_topology = self.nvml.topology(self.gpus)
        self.sandbox = sandbox or choose_sandbox(settings)
        self.runtimes = runtimes if runtimes is not None else detect_runtimes(self.gpus)
        self.slots = settings.max_concurrent_jobs or max(1, len(self.gpus))
        self.fingerprint = machine_fingerprint(
            gpu_uuids=[g.info.uuid for g in self.gpus], data_dir=settings.data_dir
        )
        self.node_id: str | None = None
        self.heartbeat_interval = 5.0
        self.jobs: dict[str, Job] = {}
        self._free_gpus: list[Gpu] = list(self.gpus)
        self._slot_freed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.session_host: SessionHost | None = None
        self.online = asyncio.Event()  # registered, its loops started: `gpu-share up` waits on it
        self.left_running = 0  # jobs still running when the drain ended: their leases will expire
        self.benchmarks = BenchmarkSchedule(
            benchmark_suite or BenchmarkSuite(scratch_dir=settings.benchmarks_dir),
            state_path=settings.data_dir / "benchmarks.json",
            interval=timedelta(hours=settings.benchmark_interval_hours),
            quiet_sec=settings.benchmark_quiet_sec,
        )
        # Hardware challenges (docs/trust.md): what one waits for is offered to no new work
        # (`_wanted`), what one runs on is held from it (`_held`); `_offered` is what the
        # lease request in flight offers ("cpu": its slots).
        self.challenges = ChallengeAnswerer(
            self.client, self, threads=os.cpu_count() or 1, quiet_sec=settings.challenge_quiet_sec
        )
        self._wanted: set[str] = set()
        self._held: set[str] = set()
        self._offered: set[str] = set()

    def busy(self) -> bool:
        """A job runs, a session is open or a challenge runs: no benchmark may use the
        machine now."""
        return (
            bool(self.jobs)
            or bool(self.session_host and self.session_host.sessions)
            or self.challenges.running
        )

    def hold(self, order: ChallengeOrder) -> bool:
        """`ChallengeHost`: the GPU named (or, for a CPU challenge, the node) from work, once
        no job, session, benchmark or lease request in flight has it. Sessions do not say
        which GPU they hold, so any open session keeps a GPU challenge waiting."""
        self._wanted.add(order.target)
        if order.target in self._offered or self.benchmarks.running:
            return False
        if order.kind is ChallengeKind.CPU:
            if self.busy():
                return False
        else:
            gpu = next((g for g in self._free_gpus if g.info.uuid == order.target), None)
            if gpu is None or (self.session_host and self.session_host.sessions):
                return False
            self._free_gpus.remove(gpu)
        self._held.add(order.target)
        return True

    def release(self, order: ChallengeOrder) -> None:
        self._wanted.discard(order.target)
        if order.target in self._held:
            self._held.discard(order.target)
            self._free_gpus.extend(g for g in self.gpus if g.info.uuid == order.target)
        self._slot_freed.set()

    def inventory(self) -> wire.NodeInventory:
        memory = psutil.virtual_memory()
        return wire.NodeInventory(
            hostname=socket.gethostname()[:255],
            agent_version=__version__,
            os=f"{platform.system()} {platform.release()}"[:200],
            cpu_model=(platform.processor() or platform.machine() or None),
            cpu_count=os.cpu_count() or 1,
            ram_mb=int(memory.total // (1024 * 1024)),
            gpus=[g.info for g in self.gpus],
            runtimes=self.runtimes,
            max_concurrent_jobs=self.slots,
            job_memory_mb=self.job_memory_mb(),
            sandbox=self.sandbox.name,
            region=self.settings.region,
            gpu_topology=self.gpu_topology,
            fingerprint=self.fingerprint,
        )

    def job_memory_mb(self) -> int | None:
        """What each job may use, as its jobs will be limited (`JobContext`), for the offers."""
        memory = job_limits(self.settings, self.slots).memory_bytes
        return None if memory is None else memory // (1024 * 1024)

    async def connect(self) -> None:
        """Use the saved node identity, or register with the enrollment token."""
        path = self.settings.identity_path
        identity = load_identity(path, self.settings.server)
        inventory = self.inventory()
        if identity is not None:
            self.client.key = identity.node_key
            try:
                ack = await self.client.update_inventory(inventory, retry_for=0)
            except Unauthorized:
                log.warning("the saved node key was refused; registering again")
            except CoordinatorError as exc:
                if exc.status != 403:
                    raise
                raise AgentStartError(
                    f"the coordinator refused this machine: {exc.message}"
                ) from exc
            else:
                self.node_id, self.heartbeat_interval = ack.node_id, ack.heartbeat_interval_sec
                return
        if self.settings.token is None:
            raise AgentStartError(
                "this agent is not registered yet: pass the provider's enrollment token "
                "with --token gpu_et_… (it is needed on the first start only)"
            )
        try:
            result = await self.client.register(
                self.settings.token.get_secret_value(), inventory, retry_for=0
            )
        except CoordinatorError as exc:
            if exc.status not in (401, 403):
                raise
            raise AgentStartError(f"registration refused: {exc.message}") from exc
        save_identity(path, Identity(self.settings.server, result.node_id, result.node_key))
        self.client.key = result.node_key
        if result.returning:
            log.info("this machine was registered before: it is node %s again", result.node_id)
        self.node_id, self.heartbeat_interval = result.node_id, result.heartbeat_interval_sec

    async def _connect_until_stopped(self, stop: asyncio.Event) -> bool:
        """Connect, retrying while the coordinator is away; False when told to stop first."""
        delay = Backoff(first=1.0, cap=30.0)
        while not stop.is_set():
            attempt = asyncio.create_task(self.connect(), name="agent:connect")
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({attempt, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not attempt.done():
                attempt.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await attempt
                return False
            try:
                attempt.result()
            except (httpx.TransportError, CoordinatorError) as exc:
                if not is_transient(exc):
                    raise AgentStartError(
                        f"{self.settings.server} refused this agent: {exc}"
                    ) from exc
                server = self.settings.server
                if isinstance(exc, httpx.TransportError):
                    problem = f"cannot reach {server}: {describe(exc)}"
                else:
                    problem = f"{server} answered {exc}"
                log.warning("%s; retrying in %g s", problem, delay.upcoming)
                if not await delay.sleep(stop):
                    return False
            else:
                return True
        return False

    async def run(self, stop: asyncio.Event, *, drain_timeout: float = 30.0) -> None:
        """Serve until `stop` is set, then let running jobs finish for `drain_timeout` seconds."""
        try:
            if await self._connect_until_stopped(stop):
                await self._serve(stop, drain_timeout)
        finally:
            await self.client.aclose()
            self.nvml.shutdown()

    async def _serve(self, stop: asyncio.Event, drain_timeout: float) -> None:
        logs.node_id.set(self.node_id)  # every line from here on, and the tasks started here
        log.info(
            "node %s online: %d GPU(s), runtimes %s, %d slot(s), %s sandbox",
            self.node_id,
            len(self.gpus),
            ", ".join(r.value for r in self.runtimes),
            self.slots,
            self.sandbox.name,
        )
        cache = ArtifactCache(self.settings.cache_dir, self.settings.cache_max_bytes)
        # Jobs write into their own folders as root-owned files; the folder above them
        # must be private or a set-user-ID file a job leaves could be run by others.
        self.settings.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.settings.jobs_dir.chmod(0o700)
        async with SafeFetcher(UrlPolicy.from_strings(self.settings.allow_networks)) as fetcher:
            threads = self.settings.job_threads or max(1, (os.cpu_count() or 1) // self.slots)
            ctx = JobContext(
                self.settings,
                self.client,
                cache,
                fetcher,
                self.sandbox,
                self.nvml,
                threads,
                slots=self.slots,
            )
            if self.settings.warm_sandboxes and WarmPool.supports(ctx.sandbox):
                assert ctx.limits is not None
                ctx.warm = WarmPool(
                    ctx.sandbox,
                    warm_dir=self.settings.warm_dir,
                    limits=ctx.limits,
                    threads=threads,
                    size=self.settings.warm_sandboxes,
                )
                ctx.warm.fill(node_keys(self.runtimes, [g.info.uuid for g in self.gpus]))
            try:
                await self._serve_with(ctx, stop, drain_timeout)
            finally:
                if ctx.warm is not None:
                    await ctx.warm.close()

    async def _serve_with(self, ctx: JobContext, stop: asyncio.Event, drain_timeout: float) -> None:
        beating = asyncio.create_task(self._heartbeats(stop), name="agent:heartbeat")
        leasing = asyncio.create_task(self._lease_loop(ctx, stop), name="agent:lease")
        self.session_host = SessionHost(ctx, self.gpus)
        hosting = asyncio.create_task(self.session_host.run(stop), name="agent:sessions")
        benchmarking = asyncio.create_task(self._benchmarks(stop), name="agent:benchmarks")
        challenging = asyncio.create_task(self._challenges(stop), name="agent:challenges")
        self.online.set()
        await stop.wait()
        for side_task in (benchmarking, challenging):  # a run in progress goes, its child killed
            side_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await side_task
        await hosting
        leasing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leasing
        await self._drain(drain_timeout)
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating

    async def _drain(self, timeout: float) -> None:
        if not self._tasks:
            return
        loop = asyncio.get_running_loop()
        if timeout > 0:
            log.info("waiting up to %.0fs for %d running job(s)", timeout, len(self._tasks))
            deadline = loop.time() + timeout
            # Again while jobs remain: one may hand its slot to a job leased with its result.
            while self._tasks and (left := deadline - loop.time()) > 0:
                await asyncio.wait(set(self._tasks), timeout=left)
        # A job whose result is on its way is over: its report is let arrive, not cut off
        # (the coordinator may have taken it already) and counted as work left running.
        deadline = loop.time() + REPORT_GRACE_SEC
        while (
            any(job.reporting for job in self.jobs.values())
            and (left := deadline - loop.time()) > 0
        ):
            await asyncio.wait(set(self._tasks), timeout=left, return_when=asyncio.FIRST_COMPLETED)
        pending = set(self._tasks)
        self.left_running = len(pending)
        for invoke_id, job in self.jobs.items():  # which, and how far (a report cut short?)
            log.info(
                "invoke %s: still %s at stop; unless its result arrived, it is requeued"
                " when its lease runs out",
                invoke_id,
                "reporting its result" if job.reporting else "running",
            )
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _benchmarks(self, stop: asyncio.Event) -> None:
        if not self.settings.benchmarks:
            return
        assert self.node_id is not None
        try:
            await self.benchmarks.run(
                stop,
                node_id=self.node_id,
                gpus=[g.info for g in self.gpus],
                uplink=CoordinatorUplink(self.client),
                busy=self.busy,
            )
        except Exception:  # a benchmark must never take the agent down
            log.exception("benchmarks stopped")

    async def _challenges(self, stop: asyncio.Event) -> None:
        if not self.settings.challenges:
            return
        try:
            await self.challenges.run(stop)
        except Exception:  # a challenge must never take the agent down
            log.exception("hardware challenges stopped")

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while True:
            beat = wire.Heartbeat(
                telemetry=await asyncio.to_thread(gpu_module.telemetry, self.nvml, self.gpus),
                running=[
                    wire.RunningLease(invoke_id=job.invoke_id, lease_token=job.lease.lease_token)
                    for job in self.jobs.values()
                ],
            )
            asked_at = loop.time()
            try:
                ack = await self.client.heartbeat(beat)
            except Exception as exc:
                log.warning(
                    "heartbeat failed (%s); the coordinator may be restarting", describe(exc)
                )
            else:
                self.heartbeat_interval = ack.heartbeat_interval_sec
                self.benchmarks.heard(ack.run_benchmark, asked_at)
                if self.settings.challenges:
                    self.challenges.heard(ack.challenge)
                for status in ack.leases:
                    job = self.jobs.get(status.invoke_id)
                    if job is None:
                        continue
                    if status.verdict is wire.LeaseVerdict.CANCEL:
                        job.outcome.canceled.set()
                    elif status.verdict is wire.LeaseVerdict.DROP:
                        job.outcome.dropped.set()
                    elif status.verdict is wire.LeaseVerdict.PREEMPT:
                        job.outcome.preempted.set()
            if stop.is_set():  # draining: keep the running jobs' leases alive
                await asyncio.sleep(self.heartbeat_interval)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.heartbeat_interval)

    async def _lease_loop(self, ctx: JobContext, stop: asyncio.Event) -> None:
        delay = Backoff(first=0.5, cap=10.0)
        while not stop.is_set():
            free = 0 if "cpu" in self._wanted else self.slots - len(self.jobs)
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            offered = [g for g in self._free_gpus if g.info.uuid not in self._wanted]
            request = wire.LeaseRequest(
                slots=free,
                free_gpus=len(offered),
                free_gpu_indices=sorted(g.info.index for g in offered),
                wait_sec=self.settings.lease_wait_sec,
                start=True,  # the lease answer is the start: one request less per job
            )
            self._offered = {"cpu", *(g.info.uuid for g in offered)}
            try:
                response = await self.client.lease(request)
            except Unauthorized as exc:
                log.error("the coordinator refused this node's key (%s); stopping", exc.message)
                stop.set()
                return
            except (httpx.TransportError, CoordinatorError) as exc:
                log.warning("lease failed (%s); retrying in %.1fs", describe(exc), delay.upcoming)
                await delay.sleep(stop)
                continue
            finally:
                self._offered = set()
            delay.reset()
            for lease in response.jobs:
                self._start(ctx, lease, stop)

    def _start(self, ctx: JobContext, lease: wire.LeasedJob, stop: asyncio.Event) -> None:
        gpus, refusal = self._take_gpus(lease)

        def successor() -> wire.LeaseRequest | None:
            """The job's slot and GPUs, leased again with its result (SQS-style): the
            next job starts without another round trip. Only what this job holds is
            offered, so the lease loop's own request never overlaps it."""
            if stop.is_set() or "cpu" in self._wanted:
                return None
            indices = sorted(g.info.index for g in gpus if g.info.uuid not in self._wanted)
            return wire.LeaseRequest(
                slots=1, free_gpus=len(indices), free_gpu_indices=indices, wait_sec=0, start=True
            )

        job = Job(ctx, lease, gpus, refusal=refusal, successor=successor)
        self.jobs[lease.invoke_id] = job

        async def run() -> None:
            try:
                with logs.bound(invoke_id=lease.invoke_id):  # the job's lines name it
                    await job.run()
            finally:
                self.jobs.pop(lease.invoke_id, None)
                self._free_gpus.extend(gpus)
                for leased in job.successors:
                    log.info(
                        "invoke %s: leased with the result of %s", leased.invoke_id, job.invoke_id
                    )
                    self._start(ctx, leased, stop)
                self._slot_freed.set()

        task = asyncio.create_task(run(), name=f"job:{lease.invoke_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take_gpus(self, lease: wire.LeasedJob) -> tuple[list[Gpu], str | None]:
        """The GPUs the lease names (or, from a coordinator that names none, the first free
        ones), now held by the job; or none and why the job cannot have them."""
        if not lease.runtime.needs_gpu:
            return [], None
        if lease.gpu_indices is None:
            gpus = self._free_gpus[: lease.gpus]
        else:
            free = {g.info.index: g for g in self._free_gpus}
            wanted = list(dict.fromkeys(lease.gpu_indices))
            mine = {g.info.index for g in self.gpus}
            if len(wanted) != lease.gpus or not set(wanted) <= free.keys():
                missing = [i for i in wanted if i not in mine]
                busy = [i for i in wanted if i in mine and i not in free]
                why = (
                    f"this node was leased GPUs {lease.gpu_indices} for a {lease.gpus}-GPU job"
                    + (f"; it has no GPU {missing}" if missing else "")
                    + (f"; GPU {busy} is running another job" if busy else "")
                    + "; the job was not started"
                )
                log.error("invoke %s: %s", lease.invoke_id, why)
                return [], why
            gpus = [free[i] for i in wanted]
        for gpu in gpus:
            self._free_gpus.remove(gpu)
        return gpus, None
