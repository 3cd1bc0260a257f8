"""The agent's side of a hardware challenge (docs/trust.md): hear it, wait until the
hardware is free, answer it in time.

The heartbeat answer names a waiting challenge. The agent starts it only when its
`ChallengeHost` (the worker) can take the hardware from work: the GPU named, with no
job, no session and no lease request offering it, or for a CPU challenge the whole idle
node. The worker then offers it to no new work until the answer is in. Between the
coordinator's calls the chain runs in a child process (`child`), so the agent never
holds a CUDA context; a child that misses a deadline is killed and the coordinator
expires the challenge.

    child readies the chain (the order carries its sizes) → start (the seed: the clock
    starts) → child runs it → commit (sketches) → the samples → child reveals them →
    reveal → the verdict
"""

import asyncio
import collections
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator
from typing import Protocol

from pydantic import BaseModel

from gpu_share.agent.challenges.child import ChildReady, ChildSeed, ChildSetup
from gpu_share.agent.client import CoordinatorClient, CoordinatorError, describe
from gpu_share.protocol.trust import (
    ChallengeCommit,
    ChallengeCommitted,
    ChallengeKind,
    ChallengeOrder,
    ChallengeReveal,
    ChallengeStart,
    ChallengeVerdict,
)

log = logging.getLogger(__name__)

POLL_SEC = 0.25
CHILD_START_SEC = 120.0  # Python, onnxruntime, a CUDA context: before the clock starts
REMEMBERED = 64  # challenges answered or refused, not to be started twice


class ChallengeHost(Protocol):
    def hold(self, order: ChallengeOrder) -> bool:
        """Take the challenged hardware from work if nothing uses or is offered it now;
        until then, offer it to no new work. True once it is held."""

    def release(self, order: ChallengeOrder) -> None:
        """Give the hardware back to work."""


class ChildFailed(Exception):
    """The chain's process died, said nothing usable, or missed its deadline."""


class ChainProcess:
    """The child running one chain; its two answers, each within a time limit. What it
    says on stderr goes to the agent's log as it comes (a pipe nobody reads would stall
    it), and its last lines explain a failure."""

    def __init__(self, process: asyncio.subprocess.Process, challenge_id: str) -> None:
        self.process = process
        self.said: collections.deque[str] = collections.deque(maxlen=20)
        self._relay = asyncio.create_task(self._relay_stderr(challenge_id))

    async def _relay_stderr(self, challenge_id: str) -> None:
        assert self.process.stderr is not None
        async for raw in self.process.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.said.append(line)
            log.info("challenge %s: %s", challenge_id, line)

    async def _line(self, seconds: float) -> bytes:
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(seconds):
                line = await self.process.stdout.readline()
        except TimeoutError:
            raise ChildFailed(f"the chain gave no answer within {seconds:.0f} s") from None
        if not line:
            await self.process.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._relay), 5)
            tail = " | ".join(self.said)[-500:]
            raise ChildFailed(f"the chain's process exited with {self.process.returncode}: {tail}")
        return line

    def close(self) -> None:
        self._relay.cancel()

    async def say(self, message: BaseModel) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(message.model_dump_json().encode() + b"\n")
        await self.process.stdin.drain()

    async def ready(self, seconds: float) -> ChildReady:
        return ChildReady.model_validate_json(await self._line(seconds))

    async def commit(self, seed: str, seconds: float) -> ChallengeCommit:
        await self.say(ChildSeed(seed=seed))
        return ChallengeCommit.model_validate_json(await self._line(seconds))

    async def reveal(self, committed: ChallengeCommitted, seconds: float) -> ChallengeReveal:
        await self.say(committed)
        return ChallengeReveal.model_validate_json(await self._line(seconds))


@contextlib.asynccontextmanager
async def chain_process(setup: ChildSetup, order: ChallengeOrder) -> AsyncIterator[ChainProcess]:
    threads = str(setup.threads)
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": threads,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONUNBUFFERED": "1",
    }
    if order.kind is ChallengeKind.GPU:
        env |= {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": order.target}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpu_share.agent.challenges.child",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        limit=64 * 1024 * 1024,  # one line carries every sketch, or every revealed row
    )
    chain = ChainProcess(process, order.id)
    await chain.say(setup)
    try:
        yield chain
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        chain.close()


class ChallengeAnswerer:
    def __init__(
        self,
        client: CoordinatorClient,
        host: ChallengeHost,
        *,
        threads: int,
        quiet_sec: float,
        poll_sec: float = POLL_SEC,
    ) -> None:
        self.client = client
        self.host = host
        self.threads = threads
        self.quiet_sec = quiet_sec
        self.poll_sec = poll_sec
        self.order: ChallengeOrder | None = None
        self.running = False
        self.verdicts: list[ChallengeVerdict] = []  # this process's answered challenges
        self._tried: list[str] = []
        self._heard = asyncio.Event()

    def heard(self, order: ChallengeOrder | None) -> None:
        """A heartbeat answer: the challenge waiting, if any."""
        if order is not None and order.id not in self._tried and not self.running:
            if self.order is None or self.order.id != order.id:
                log.info("a hardware challenge waits: %s as %s", order.target, order.claimed_model)
            self.order = order
            self._heard.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            order = self.order
            if order is None:
                self._heard.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wait_either(self._heard, stop), 3600)
                continue
            if not await self._hold(order, stop):
                return
            self.running = True
            try:
                await self.answer(order)
            except (CoordinatorError, ChildFailed, OSError, ValueError) as exc:
                log.warning("challenge %s not answered: %s", order.id, describe(exc))
            finally:
                self.running = False
                self.host.release(order)
                self._forget(order)

    @staticmethod
    async def _wait_either(first: asyncio.Event, second: asyncio.Event) -> None:
        waits = {asyncio.create_task(first.wait()), asyncio.create_task(second.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    async def _hold(self, order: ChallengeOrder, stop: asyncio.Event) -> bool:
        """Wait until the host has held the hardware for `quiet_sec`; False when stopping."""
        loop = asyncio.get_running_loop()
        held_since: float | None = None
        while not stop.is_set():
            if held_since is None and self.host.hold(order):
                held_since = loop.time()
            if held_since is not None and loop.time() - held_since >= self.quiet_sec:
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_sec)
        if held_since is not None:
            self.host.release(order)
        return False

    def _forget(self, order: ChallengeOrder) -> None:
        self._tried = [*self._tried[-REMEMBERED:], order.id]
        if self.order is not None and self.order.id == order.id:
            self.order = None

    async def answer(self, order: ChallengeOrder) -> ChallengeVerdict | None:
        """Ready the chain's process first (imports, graphs, device memory), then ask for
        the seed: the clock measures the chain, not Python starting."""
        setup = ChildSetup(params=order.params, threads=self.threads)
        async with chain_process(setup, order) as chain:
            ready = await chain.ready(CHILD_START_SEC)
            started = await self.client.start_challenge(order.id)
            params = started.params
            log.info(
                "challenge %s on %s: %d steps over %d rows of %d, commit by %s",
                order.id,
                ready.engine,
                params.steps,
                params.rows,
                params.width,
                started.commit_by.isoformat(),
            )
            if params != order.params:
                raise ChildFailed("the challenge started with other sizes than it was ordered")
            commit = await chain.commit(started.seed, params.deadline_sec)
            committed = await self.client.commit_challenge(order.id, commit)
            verdict = committed.verdict
            if verdict is None:
                reveal = await chain.reveal(committed, params.deadline_sec)
                verdict = await self.client.reveal_challenge(order.id, reveal)
        self._log(started, verdict)
        self.verdicts.append(verdict)
        return verdict

    @staticmethod
    def _log(started: ChallengeStart, verdict: ChallengeVerdict) -> None:
        if verdict.status == "passed":
            log.info(
                "challenge %s passed at %.1f %s", started.id, verdict.rate or 0, verdict.rate_unit
            )
        else:
            log.warning("challenge %s %s: %s", started.id, verdict.status.value, verdict.reason)
