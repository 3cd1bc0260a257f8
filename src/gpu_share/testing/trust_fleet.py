"""A marketplace of simulated nodes for the trust bench (`bench/trust.py`, docs/trust.md):
honest nodes with the floating-point noise of other hardware, cheaters of each kind
(`rogue_agents`), and a trusted fleet of the platform's own nodes, all registered with
an in-process coordinator over the real agent protocol and their hardware challenged.

Cheaters, one kind after another: every result made up (`always_fake`); a tenth of them
(`fake_10pct`); failures reported without running anything (`fake_failures`); an H100
claimed by a box that answers its challenge late, with made-up sketches or with another
chain (`fake_hardware`); 500 honest jobs, then made-up results (`honest_then_fake`).
Each cheater is a provider of its own; honest nodes come ten to a provider. Noise is
relative, log-uniform over 1e-7…2e-3: a few ulps up to TF32 through a deep network.
`trust_ticks` moves time for them.
"""

import math
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI

from gpu_share.coordinator.loops import challenges as challenge_loop
from gpu_share.coordinator.replica.state import Replica
from gpu_share.protocol import agent as wire
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.trust import ChallengeStatus
from gpu_share.testing.challenge_answers import ChallengeAnswer
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import (
    ADMIN,
    ProviderHandle,
    TenantHandle,
    bearer,
    create_provider,
    create_tenant,
)
from gpu_share.testing.rogue_agents import (
    FakeFailures,
    FakeOutputs,
    FakeShare,
    Honest,
    HonestThenFake,
)
from gpu_share.testing.simulated_agent import H100, SimulatedAgent, inventory
from gpu_share.testing.verification import mark_verified

STRATEGIES = ["always_fake", "fake_10pct", "fake_failures", "fake_hardware", "honest_then_fake"]
FAKE_HARDWARE_WAYS = ["late", "made_up_sketches", "other_matrix"]
PRICE = "3.6"  # USDC per GPU-hour: a 60 s job costs 0.06
RUNTIME = RuntimeName.ONNX_CUDA
TRUSTED_GPUS = 8
NODES_PER_PROVIDER = 10  # honest providers; each cheater is a provider of its own
NOISE = (1e-7, 2e-3)


@dataclass(frozen=True)
class FleetConfig:
    """The marketplace: its size, its cheaters, how long each works."""

    nodes: int = 1000
    jobs: int = 2
    veterans: int = 2
    veteran_jobs: int = 500
    challenged: int = 100  # honest nodes answering a real challenge
    cheat_share: float = 0.05
    budget: int = 200  # fabricated results a cheater may report
    turn_after: int = 500  # honest jobs before a turncoat fakes
    trusted: int = 8
    tenants: int = 10
    arrival_ticks: int = 100
    job_sec: float = 60.0
    seed: int = 1


@dataclass
class Node:
    """One simulated machine and what it has done so far."""

    agent: SimulatedAgent
    kind: str  # "honest", "veteran" or a strategy
    answer: Any  # a rogue_agents behaviour
    limit: int  # jobs (honest) or fabricated results (cheaters) before it stops
    join_tick: int
    jobs: int = 0
    fabricated: int = 0
    job: wire.LeasedJob | None = None
    caught_jobs: int | None = None  # jobs reported when it was found quarantined
    caught_fabricated: int | None = None
    leased_unverified: int = 0  # fake hardware: jobs it got (must stay 0)

    @property
    def honest(self) -> bool:
        return self.kind in ("honest", "veteran")

    def continues(self) -> bool:
        """Whether it wants another job: honest nodes until their jobs are done, cheaters
        until their made-up results are (or, faking a share, a generous cap of jobs)."""
        if self.honest:
            return self.jobs < self.limit
        return self.fabricated < self.limit and self.jobs < 20 * self.limit + self.limit_honest

    def goes_on_after_this(self) -> bool:
        """Whether it goes on after the job it holds (its counts not yet moved), to submit
        a job for each. A cheat faking a share is counted as going on: when it stops
        instead, its job waits in the queue for the next node that leases."""
        if self.honest:
            return self.jobs + 1 < self.limit
        if isinstance(self.answer, HonestThenFake):
            fakes = self.answer.answered + 1 > self.answer.honest_jobs
            return self.fabricated + fakes < self.limit
        if isinstance(self.answer, FakeShare):
            return True
        return self.fabricated + 1 < self.limit

    @property
    def limit_honest(self) -> int:
        return self.answer.honest_jobs if isinstance(self.answer, HonestThenFake) else 0

    async def respond(self, job: wire.LeasedJob) -> tuple[wire.ResultReport, bool]:
        """The report, and whether it was made up."""
        if isinstance(self.answer, FakeShare):
            before = self.answer.faked
            report = await self.answer(job)
            return report, self.answer.faked > before
        report = await self.answer(job)
        if isinstance(self.answer, HonestThenFake):
            return report, self.answer.answered > self.answer.honest_jobs
        return report, self.kind in ("always_fake", "fake_failures")


@dataclass
class Fleet:
    """The marketplace, and what the ticks record of it for the bench."""

    replica: Replica
    client: httpx.AsyncClient
    clock: FrozenClock
    config: FleetConfig
    tenants: list[TenantHandle]
    nodes: list[Node]
    trusted: list[SimulatedAgent]
    trusted_answer: list[Honest]
    rng: random.Random
    progress: Callable[[str], None]
    held_checks: dict[int, list[wire.LeasedJob]] = field(default_factory=dict)
    checks_left: bool = False  # the trusted nodes' last lease may have left checks queued
    jobs_made: int = 0
    fabricated_ids: set[str] = field(default_factory=set)
    steady_ids: set[str] = field(default_factory=set)  # veterans' jobs decided near the floor
    turncoat_steady_ids: set[str] = field(default_factory=set)
    peak_checks: int = 0
    ticks: int = 0
    challenge_failures: dict[str, str] = field(default_factory=dict)  # node id → reason
    spent: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    _mark: float = 0.0

    def mark(self, phase: str) -> None:
        """Wall time since the last mark goes to `phase` (where a tick's time goes)."""
        now = time.perf_counter()
        if self._mark:
            self.spent[phase] += now - self._mark
        self._mark = now


async def make_fleet(
    config: FleetConfig,
    app: FastAPI,
    clock: FrozenClock,
    client: httpx.AsyncClient,
    progress: Callable[[str], None] = lambda text: None,
) -> Fleet:
    """Tenants with money, the trusted fleet (proven, marked), and the nodes registered,
    each provider pricing its H100s; `progress` hears how far it got."""
    replica: Replica = app.state.replica
    rng = random.Random(config.seed)  # noqa: S311 (a simulation that repeats, not secrets)
    nprng = np.random.default_rng(config.seed)
    transport = httpx.ASGITransport(app=app)
    tenants = [await create_tenant(client, f"Tenant {n}") for n in range(config.tenants)]
    for tenant in tenants:
        topped = await client.post(
            f"/v1/admin/tenants/{tenant.id}/top-ups",
            json={"amount": "100000", "reference": f"wire-{tenant.id}"},
            headers=ADMIN,
        )
        assert topped.status_code in (200, 201), topped.text

    async def provider(name: str) -> ProviderHandle:
        return await create_provider(client, name)

    priced: set[str] = set()

    def noise() -> float:
        return float(10 ** nprng.uniform(math.log10(NOISE[0]), math.log10(NOISE[1])))

    async def agent(owner: ProviderHandle, name: str, gpus: int = 1) -> SimulatedAgent:
        made = SimulatedAgent(
            "http://testserver",
            transport=transport,
            node_inventory=inventory(
                runtimes=[RUNTIME], gpus=[H100] * gpus, slots=gpus, machine=name
            ),
        )
        await made.register(owner.enrollment_token)
        if owner.id not in priced:  # a provider prices the models its machines run
            answer = await client.put(
                f"/v1/provider/prices/{H100.model}",
                json={"price_per_gpu_hour": PRICE, "spot_discount_pct": 50},
                headers=bearer(owner.key),
            )
            assert answer.status_code == 200, answer.text
            priced.add(owner.id)
        return made

    platform = await provider("Platform")
    trusted = [await agent(platform, f"trusted{n}", TRUSTED_GPUS) for n in range(config.trusted)]
    await prove_trusted(replica, client, clock, trusted)
    trusted_answer = [Honest(noise=noise(), seed=n) for n in range(config.trusted)]

    cheaters = round(config.nodes * config.cheat_share)
    kinds = [STRATEGIES[n % len(STRATEGIES)] for n in range(cheaters)]
    honest = config.nodes - cheaters
    kinds += ["veteran"] * min(config.veterans, honest)
    kinds += ["honest"] * (honest - min(config.veterans, honest))
    nodes: list[Node] = []
    owner: ProviderHandle | None = None
    started = time.perf_counter()
    for n, kind in enumerate(kinds):
        seed = config.seed * 100_003 + n
        if kind in ("honest", "veteran"):
            if owner is None or n % NODES_PER_PROVIDER == 0:
                owner = await provider(f"Farm {n}")
            who = owner
        else:
            who = await provider(f"Rogue {n}")
        answer: Any
        limit = config.budget
        if kind in ("honest", "veteran"):
            answer = Honest(noise=noise(), seed=seed)
            limit = config.veteran_jobs if kind == "veteran" else config.jobs
        elif kind == "always_fake":
            answer = FakeOutputs(seed)
        elif kind == "fake_10pct":
            answer = FakeShare(share=0.1, seed=seed)
        elif kind == "fake_failures":
            answer = FakeFailures()
        elif kind == "fake_hardware":
            answer = None
        else:
            answer = HonestThenFake(
                honest_jobs=config.turn_after,
                _fake=FakeOutputs(seed),
                _honest=Honest(noise=noise(), seed=seed),
            )
        # Those with a long way to go start at once; the others arrive over a while.
        late = kind in ("honest", "always_fake", "fake_10pct", "fake_failures")
        join = rng.randrange(config.arrival_ticks) if late else 0
        nodes.append(Node(await agent(who, f"m{n}"), kind, answer, limit, join))
        if (n + 1) % 200 == 0:
            progress(f"registered {n + 1} nodes ({time.perf_counter() - started:.0f} s)")
    return Fleet(
        replica, client, clock, config, tenants, nodes, trusted, trusted_answer, rng, progress
    )


def honestly(clock: FrozenClock) -> ChallengeAnswer:
    """An honest node's answer: its chain takes 2 s of the coordinator's clock."""
    return ChallengeAnswer(before_commit=lambda: clock.advance(2.0))


async def prove_trusted(
    replica: Replica, client: httpx.AsyncClient, clock: FrozenClock, trusted: list[SimulatedAgent]
) -> None:
    """The platform's own nodes prove each of their GPUs (one challenge at a time per
    node), then the admin marks them trusted."""
    for _ in range(TRUSTED_GPUS):
        await challenge_loop.run_once(replica)
        for agent in trusted:
            answered = await agent.answer_challenge(honestly(clock))
            verdict = answered.verdict
            assert verdict is not None and verdict.status is ChallengeStatus.PASSED, verdict
    for agent in trusted:
        marked = await client.post(
            f"/v1/admin/nodes/{agent.node_id}/trusted", json={"trusted": True}, headers=ADMIN
        )
        assert marked.status_code == 200, marked.text
        assert marked.json().get("verified", True), marked.text


async def prove_hardware(fleet: Fleet) -> None:
    """Nodes answer the challenge their heartbeat names: the cheaters (fake hardware as a
    box without the claimed GPU would) and `challenged` honest nodes honestly; the other
    honest nodes' GPUs are written verified as a pass would leave them
    (`testing/verification.py`), which saves a minute of answering the same honest
    chain."""
    settings = fleet.replica.settings
    deadline = settings.challenge_allowance_sec + (
        settings.challenge_target_sec / settings.challenge_efficiency_floor
    )
    answering = [n for n in fleet.nodes if not n.honest]
    honest = [n for n in fleet.nodes if n.honest]
    answering += honest[: fleet.config.challenged]
    for node in honest[fleet.config.challenged :]:
        await mark_verified(fleet.replica, node.agent.node_id or "")
    await challenge_loop.run_once(fleet.replica)
    started = time.perf_counter()
    honest_answer = honestly(fleet.clock)
    fakes = 0
    for n, node in enumerate(answering):
        how = honest_answer
        if node.kind == "fake_hardware":
            # Before its verdict, it asks for work like any node: it must get none.
            node.leased_unverified += len(await node.agent.lease(slots=1, start=True))
            way = FAKE_HARDWARE_WAYS[fakes % len(FAKE_HARDWARE_WAYS)]
            fakes += 1
            if way == "late":  # a CPU computing what an H100 does in seconds
                how = ChallengeAnswer(before_commit=lambda: fleet.clock.advance(deadline + 1))
            elif way == "made_up_sketches":
                how = ChallengeAnswer(made_up_sketches=True)
            else:  # another chain, cheaper to precompute
                how = ChallengeAnswer(other_matrix=True)
        answered = await node.agent.answer_challenge(how)
        verdict = answered.verdict
        assert verdict is not None
        if verdict.status is not ChallengeStatus.PASSED:
            fleet.challenge_failures[node.agent.node_id or ""] = verdict.reason or "failed"
        if (n + 1) % 100 == 0:
            fleet.progress(f"challenged {n + 1} nodes ({time.perf_counter() - started:.0f} s)")
