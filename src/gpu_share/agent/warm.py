"""Warm sandboxes: ONNX runtime processes started ahead of their job, one job each.

Starting Python and importing numpy and onnxruntime costs a sandboxed invoke ~250 ms;
loading and running a small model costs ~5 ms. So the agent keeps, per ONNX runtime
and GPU (`WarmKey`: CPU jobs, and 1-GPU jobs per GPU), `size` sandboxes started ahead
of time through the same `Sandbox.start` as a cold job, with the same spec: no
network, own PID namespace, nobody, no host files, only that GPU, the slot's limits.
Each one's folder holds only the FIFO `go`; its process (`onnx --warm`,
`runtimes/warm.py`) imports its runtime, says it is ready on stdout and waits on `go`
for exactly one job.

A job takes one (`hand_over`): the agent copies the job's inputs and spec into that
folder (copies, never links: the job owns its folder's files, and a hard link would let
it rewrite the agent's cache) and moves the folder to where the job's own was, the
job's limits replace the slot's (its CPU-time budget is lowered by the process itself
before it reads the job), and the order goes down `go`. The process runs the job as
the cold runtime would and exits; a new one is started in the background once the job's
result is reported (`reported`), so that its start competes neither with the job nor
with the report and the tenant's answer (a job that comes while it is still importing
takes it and waits for the rest, which is still sooner than a new start). Starting it
at the hand-over, or at the exit, instead measured slower on a 2-core machine
(bench/README.md). Nothing of a
job reaches the next: each process serves one job, each folder is new and removed
after its job.

A job that does not fit — another runtime, several GPUs, other limits, large inputs —
or that finds the pool empty, starts its own sandbox as before.

Each kind starts with one waiting sandbox, so an idle agent stays light. A kind whose
job found its sandbox still starting, or none, gets one more (up to `size`): jobs come
faster than a sandbox starts, so one starts while the other waits. Back to back on a
2-core machine that took a digits job from ~105 to ~27 ms (bench/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from gpu_share.agent.runtimes.jobspec import RUNTIME_MODULES
from gpu_share.agent.runtimes.warm import GO_FIFO, READY_LINE, WARM_FLAG
from gpu_share.agent.sandbox import (
    BwrapSandbox,
    JobLimits,
    ProcessSandbox,
    Sandbox,
    SandboxedProcess,
    SandboxSpec,
)
from gpu_share.agent.sandbox.cgroups import agent_cgroups
from gpu_share.agent.sandbox.process import SubprocessJob, copy_inputs
from gpu_share.agent.sandbox.supervisor import CPU_GRACE_SEC
from gpu_share.protocol.runtimes import RuntimeName

log = logging.getLogger(__name__)

MiB = 1024 * 1024
GiB = 1024 * MiB
SPEC_FILE = "spec.json"
WARM_RUNTIMES = (RuntimeName.ONNX_CPU, RuntimeName.ONNX_CUDA)
PROCESS_BYTES = 100 * MiB
"""What one waiting process holds (Python, numpy, onnxruntime imported): ~60–100 MB."""
MIN_AVAILABLE_BYTES = 1 * GiB
"""Memory left for jobs: no warm process is started when less than this would remain."""
MAX_INPUT_BYTES = 256 * MiB
"""Inputs are copied into a warm folder; past this a cold start, which binds them, costs less."""
READY_TIMEOUT_SEC = 120.0
REFILL_AFTER_SEC = 2.0
"""A job's sandbox is replaced once the job's result is reported (`reported`), at the
latest this long after its process ended: the next one's start (a Python importing its
runtime, ~150 ms of CPU) then does not compete with the report and the tenant's answer.
Refilling at the exit instead measured ~15 ms slower end to end on 2 cores
(bench/README.md)."""
MAX_FAILED_STARTS = 3
"""Warm processes of one kind that died before any job in a row: the pool stops trying."""


@dataclass(frozen=True)
class WarmKey:
    runtime: RuntimeName
    gpu_uuids: tuple[str, ...] = ()


@dataclass
class WarmSandbox:
    key: WarmKey
    folder: Path
    process: SubprocessJob
    go: int  # the agent's end of the FIFO, held until the process exits
    ready: asyncio.Task[bool]  # imported and furnished (bwrap has bound its folder)
    handed_over: bool = False  # a job runs in it: the job's to end
    disposing: bool = False
    reported: asyncio.Event = field(default_factory=asyncio.Event)  # its job's result is sent

    def close_go(self) -> None:
        if self.go >= 0:
            with contextlib.suppress(OSError):
                os.close(self.go)
            self.go = -1


class WarmPool:
    """The warm sandboxes of one agent; `close()` kills those no job took."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        warm_dir: Path,
        limits: JobLimits,
        threads: int,
        size: int = 1,
        available_memory: Callable[[], int] = lambda: psutil.virtual_memory().available,
    ) -> None:
        """`sandbox` is the job context's (limited) sandbox; `limits` the slot's, without a
        wall time: a job's differ from them only by its timeout. `warm_dir` holds the warm
        folders, apart from the job folders but on their file system (a folder moves from
        one to the other); what an earlier run left there is removed now."""
        self.sandbox = sandbox
        self.warm_dir = warm_dir
        remove_leftovers(warm_dir, cgroups=limits.cgroups)
        self.limits = replace(limits, wall_sec=None)
        self.threads = threads
        self.size = size  # the most kept per kind; each starts with one (module doc)
        self.available_memory = available_memory
        self.wanted: dict[WarmKey, int] = {}
        self.idle: dict[WarmKey, list[WarmSandbox]] = {}
        self._starting: dict[WarmKey, int] = {}
        self._failed: dict[WarmKey, int] = {}
        self._starts: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: dict[Path, WarmSandbox] = {}  # by the job folder it became
        self._closed = False

    @staticmethod
    def supports(sandbox: Sandbox) -> bool:
        """Bubblewrap and the process sandbox; a Docker job keeps its own container."""
        inner = getattr(sandbox, "inner", sandbox)
        return isinstance(inner, BwrapSandbox | ProcessSandbox)

    def fill(self, keys: Iterable[WarmKey]) -> None:
        for key in keys:
            self._refill(key)

    def sandbox_spec(self, key: WarmKey, folder: Path) -> SandboxSpec:
        """A warm process's spec: a cold job's, but for its program and its empty folder."""
        return SandboxSpec(
            argv=[sys.executable, "-m", RUNTIME_MODULES[key.runtime], WARM_FLAG],
            job_dir=folder,
            inputs={},
            env={},
            gpu_uuids=key.gpu_uuids,
            cpu_threads=self.threads,
            limits=self.limits,
        )

    async def hand_over(self, runtime: RuntimeName, spec: SandboxSpec) -> SandboxedProcess | None:
        """Start `spec` (a job's, its folder ready) in a warm sandbox, whose folder takes the
        place of the job's; None: start it cold (the job's folder is then as it was)."""
        key = self._key(runtime, spec)
        if key is None:
            return None
        warm = self._take(key)
        if warm is None or not warm.ready.done():
            self._grow(key)  # this job came sooner than a sandbox could be ready for it
        if warm is None:
            self._refill(key)  # for the next job
            return None
        try:
            return await self._hand_over(warm, spec)
        except asyncio.CancelledError:  # the agent is stopping: this one will run nothing
            warm.process.kill()
            self._background(self._dispose(warm), f"warm-dispose:{warm.folder.name}")
            raise

    async def _hand_over(self, warm: WarmSandbox, spec: SandboxSpec) -> SandboxedProcess | None:
        key = warm.key
        if not await warm.ready:  # one still importing is still sooner than a new one
            await self._dispose(warm)
            self._refill(key)
            return None
        skeleton = (spec.job_dir / SPEC_FILE).read_bytes()
        try:
            rlimits = await asyncio.to_thread(self._place, warm, spec)
            order = {
                "argv": spec.argv[3:],
                "rlimits": {
                    name: [value, value + CPU_GRACE_SEC if name == "RLIMIT_CPU" else value]
                    for name, value in rlimits.items()
                },
            }
            os.write(warm.go, json.dumps(order).encode() + b"\n")
        except (OSError, ValueError) as exc:
            log.warning("warm sandbox %s could not take its job (%s)", warm.folder.name, exc)
            await self._dispose(warm)
            if not (spec.job_dir / SPEC_FILE).is_file():  # the job's folder again, to start cold
                await asyncio.to_thread(shutil.rmtree, spec.job_dir, True)
                (spec.job_dir / "in").mkdir(parents=True)
                (spec.job_dir / "out").mkdir()
                (spec.job_dir / SPEC_FILE).write_bytes(skeleton)
            self._refill(key)
            return None
        warm.handed_over = True
        self._running[warm.folder] = warm
        return warm.process

    def starting(self, key: WarmKey) -> int:
        """Sandboxes of this kind being started now."""
        return self._starting.get(key, 0)

    def reported(self, job_dir: Path) -> None:
        """The job whose folder was `job_dir` has sent its result (or will send none): if it
        ran in a warm sandbox, that one's replacement may start now."""
        warm = self._running.get(job_dir)
        if warm is not None:
            warm.reported.set()

    async def close(self) -> None:
        """Kill every warm process no job took, and remove their folders."""
        self._closed = True
        for warm in self._running.values():  # no replacement comes: its watcher need not wait
            warm.reported.set()
        if self._starts:  # a start in progress ends on its own, and is then disposed of
            await asyncio.wait(set(self._starts), timeout=60)
        idle = [warm for sandboxes in self.idle.values() for warm in sandboxes]
        self.idle.clear()
        for warm in idle:
            warm.process.kill()
        await asyncio.gather(*(self._dispose(warm) for warm in idle), return_exceptions=True)
        if self._tasks:  # the watchers: every process they watch is ending
            _, stuck = await asyncio.wait(set(self._tasks), timeout=30)
            for task in stuck:
                task.cancel()

    def _key(self, runtime: RuntimeName, spec: SandboxSpec) -> WarmKey | None:
        if runtime not in WARM_RUNTIMES or self._closed:
            return None
        if spec.argv != [sys.executable, "-m", RUNTIME_MODULES[runtime], SPEC_FILE]:
            return None
        if spec.env or spec.cpu_threads != self.threads or len(spec.gpu_uuids) > 1:
            return None
        if spec.limits is None or replace(spec.limits, wall_sec=None) != self.limits:
            return None  # limits other than the timeout's are applied at the start
        try:
            contents = {path.name for path in spec.job_dir.iterdir()}
            if not contents <= {"in", "out", SPEC_FILE} or any((spec.job_dir / "in").iterdir()):
                return None
            if any((spec.job_dir / "out").iterdir()):
                return None
            if sum(Path(path).stat().st_size for path in spec.inputs.values()) > MAX_INPUT_BYTES:
                return None
        except OSError:
            return None
        return WarmKey(runtime, tuple(spec.gpu_uuids))

    def _take(self, key: WarmKey) -> WarmSandbox | None:
        """The longest-waiting one that is ready, else one still starting."""
        sandboxes = [warm for warm in self.idle.get(key, []) if not warm.process.exited]
        ready = [warm for warm in sandboxes if warm.ready.done() and warm.ready.result()]
        starting = [warm for warm in sandboxes if not warm.ready.done()]
        for warm in ready + starting:
            self.idle[key].remove(warm)
            self._failed[key] = 0
            return warm
        return None  # one that died is its watcher's to dispose of

    def _place(self, warm: WarmSandbox, spec: SandboxSpec) -> dict[str, int]:
        """Copy the job's files into the warm folder and move it where the job's folder was
        (that one, its spec and two empty folders, removed); the rlimits the process must
        lower."""
        copy_inputs(spec.inputs, warm.folder / "in")
        shutil.copyfile(spec.job_dir / SPEC_FILE, warm.folder / SPEC_FILE)
        (warm.folder / "out").mkdir(exist_ok=True)
        shutil.rmtree(spec.job_dir)
        warm.folder.rename(spec.job_dir)  # the sandbox's bind follows the folder, not its name
        warm.folder = spec.job_dir
        assert spec.limits is not None
        return warm.process.assign(spec.limits, spec.job_dir)

    def _grow(self, key: WarmKey) -> None:
        wanted = self.wanted.get(key, 1)
        if wanted < self.size:
            self.wanted[key] = wanted + 1
            log.info(
                "jobs for %s come faster than a sandbox starts: keeping %d warm",
                key.runtime.value,
                wanted + 1,
            )

    def _refill(self, key: WarmKey) -> None:
        if self._closed or self.size <= 0 or self._failed.get(key, 0) >= MAX_FAILED_STARTS:
            return
        wanted = min(self.size, self.wanted.get(key, 1))
        missing = wanted - len(self.idle.get(key, [])) - self._starting.get(key, 0)
        for _ in range(missing):
            self._starting[key] = self._starting.get(key, 0) + 1
            task = asyncio.create_task(self._start(key), name=f"warm:{key.runtime.value}")
            self._starts.add(task)
            task.add_done_callback(self._starts.discard)

    async def _start(self, key: WarmKey) -> None:
        try:
            warm = await self._start_one(key)
        finally:
            self._starting[key] -= 1
        if warm is None:
            return
        if self._closed:
            await self._dispose(warm)
            return
        self.idle.setdefault(key, []).append(warm)
        self._background(self._watch(warm), f"warm-watch:{warm.folder.name}")

    async def _start_one(self, key: WarmKey) -> WarmSandbox | None:
        if self.available_memory() < MIN_AVAILABLE_BYTES + PROCESS_BYTES:
            log.info("warm sandbox for %s not started: memory is short", key.runtime.value)
            return None
        folder = self.warm_dir / f"{key.runtime.value}-{secrets.token_hex(6)}"
        go: int | None = None
        try:
            folder.mkdir(mode=0o700)
            os.mkfifo(folder / GO_FIFO, 0o600)
            # Read-write, so opening never blocks and an order written before the process
            # opens its end waits in the pipe.
            go = os.open(folder / GO_FIFO, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            process = await self.sandbox.start(self.sandbox_spec(key, folder))
        except Exception as exc:
            log.warning("cannot start a warm sandbox for %s: %s", key.runtime.value, exc)
            self._failed[key] = self._failed.get(key, 0) + 1
            if go is not None:
                os.close(go)
            await asyncio.to_thread(shutil.rmtree, folder, True)
            return None
        if not isinstance(process, SubprocessJob):  # a sandbox this pool does not know
            process.kill()
            await process.wait()
            os.close(go)
            await asyncio.to_thread(shutil.rmtree, folder, True)
            self._failed[key] = MAX_FAILED_STARTS
            return None
        ready = asyncio.create_task(_announced(process), name=f"warm-ready:{folder.name}")
        return WarmSandbox(key, folder, process, go, ready)

    async def _watch(self, warm: WarmSandbox) -> None:
        """Close the FIFO once the process has exited; replace one that died before its job
        (a few times in a row at most)."""
        code = await warm.process.wait()
        if warm.handed_over:  # its job is over: a new one takes its place once it reported
            warm.close_go()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(warm.reported.wait(), REFILL_AFTER_SEC)
            self._running.pop(warm.folder, None)
            self._refill(warm.key)
            return
        if warm.disposing:
            warm.close_go()
            return
        sandboxes = self.idle.get(warm.key, [])
        if warm in sandboxes:
            sandboxes.remove(warm)
        await self._dispose(warm)
        if self._closed:
            return
        self._failed[warm.key] = self._failed.get(warm.key, 0) + 1
        log.warning(
            "warm sandbox %s died before its job (exit %s); replacing it", warm.folder.name, code
        )
        self._refill(warm.key)

    def _background(self, work: Coroutine[None, None, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dispose(self, warm: WarmSandbox) -> None:
        """End a warm process no job will run in, and remove its folder."""
        warm.disposing = True
        warm.process.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(warm.process.wait(), 30)
        warm.close_go()
        await asyncio.to_thread(shutil.rmtree, warm.folder, True)


def remove_leftovers(warm_dir: Path, *, cgroups: bool) -> None:
    """Clear what an earlier run of this agent left of its warm sandboxes (it was killed):
    their cgroups and folders; and make the folder private, as the jobs folder is."""
    warm_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    warm_dir.chmod(0o700)
    system = agent_cgroups(warm_dir) if cgroups else None
    if system is not None:
        system.remove_leftovers()
    for path in warm_dir.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


async def _announced(process: SubprocessJob) -> bool:
    """Whether the process says it is ready (what it printed before is its start's)."""
    try:
        async with asyncio.timeout(READY_TIMEOUT_SEC):
            while line := await process.stdout.readline():
                if line.decode(errors="replace").strip() == READY_LINE:
                    return True
    except (TimeoutError, ValueError):
        pass
    return False


def node_keys(runtimes: Iterable[RuntimeName], gpu_uuids: Iterable[str]) -> list[WarmKey]:
    """What a node keeps warm: CPU jobs, and a 1-GPU job on each of its GPUs."""
    runtimes = set(runtimes)
    keys = [WarmKey(RuntimeName.ONNX_CPU)] if RuntimeName.ONNX_CPU in runtimes else []
    if RuntimeName.ONNX_CUDA in runtimes:
        keys += [WarmKey(RuntimeName.ONNX_CUDA, (uuid,)) for uuid in gpu_uuids]
    return keys
