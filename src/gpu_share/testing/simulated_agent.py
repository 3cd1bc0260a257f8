"""A simulated agent that speaks the real agent protocol over HTTP (ASGI or a socket).

It stands in for the parts that cannot exist in a test (a GPU, a real job's runtime):
it registers with a made-up inventory, leases, starts and reports results through
the same `CoordinatorClient` the real agent uses.
"""

import asyncio
import base64
import contextlib
import hashlib
import io
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from gpu_share.agent.client import CoordinatorClient, StaleLease, is_transient
from gpu_share.protocol import agent as wire
from gpu_share.protocol.invokes import InvokeResult, InvokeStatus, Metrics
from gpu_share.protocol.nodes import GpuInfo, GpuTopology, SandboxKind, Telemetry
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.challenge_answers import Answered, ChallengeAnswer, answer

H100 = GpuInfo(
    index=0,
    uuid="GPU-00000000-0000-0000-0000-000000000001",
    model="NVIDIA H100 80GB HBM3",
    vram_mb=81559,
    driver_version="550.54.15",
    cuda_version="12.4",
    pci_bus_id="00000000:01:00.0",
    compute_capability="9.0",
)


def inventory(
    *,
    runtimes: list[RuntimeName] | None = None,
    gpus: list[GpuInfo] | None = None,
    slots: int = 1,
    region: str | None = None,
    hostname: str = "sim-node",
    sandbox: SandboxKind = SandboxKind.PROCESS,
    gpu_topology: GpuTopology | None = None,
    fingerprint: str | None = None,
    job_memory_mb: int | None = None,
    machine: str | None = None,
) -> wire.NodeInventory:
    """A node's inventory; `gpus=[H100] * 4` makes four distinct GPUs (index 0…3, own UUIDs).
    `fingerprint` (`machine_fingerprint`): the machine, as the real agent names it; a
    `machine` name goes into its GPUs' UUIDs, so machines named apart have cards of their own."""
    cards = _distinct(gpus or [])
    if machine is not None:
        cards = [g.model_copy(update={"uuid": f"{g.uuid}-{machine}"}) for g in cards]
    return wire.NodeInventory(
        hostname=hostname,
        agent_version="sim",
        cpu_count=4,
        ram_mb=16384,
        gpus=cards,
        runtimes=runtimes or [RuntimeName.ONNX_CPU],
        max_concurrent_jobs=slots,
        job_memory_mb=job_memory_mb,
        sandbox=sandbox,
        region=region,
        gpu_topology=gpu_topology,
        fingerprint=fingerprint,
    )


def _distinct(gpus: list[GpuInfo]) -> list[GpuInfo]:
    """The same GPU listed again becomes the next one of the machine, as NVML would list it."""
    if len({g.index for g in gpus}) == len(gpus):
        return gpus
    return [
        g if n == 0 else g.model_copy(update={"index": n, "uuid": f"{g.uuid}-{n}"})
        for n, g in enumerate(gpus)
    ]


def own_gpus(node_inventory: wire.NodeInventory, taken: set[str]) -> wire.NodeInventory:
    """The inventory of another machine with the same cards: a GPU whose UUID is `taken`
    (another simulated machine has it) gets one of its own, as a second physical card
    would. The coordinator knows a machine by its GPUs (`nodes/hardware.py`), so without
    this every node listing `H100` would be one machine registering again."""
    gpus = []
    for gpu in node_inventory.gpus:
        uuid, n = gpu.uuid, 0
        while uuid in taken:
            n += 1
            uuid = f"{gpu.uuid}-m{n}"
        taken.add(uuid)
        gpus.append(gpu if uuid == gpu.uuid else gpu.model_copy(update={"uuid": uuid}))
    return node_inventory.model_copy(update={"gpus": gpus})


def npz_bytes(**arrays: object) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def done_report(
    job: wire.LeasedJob, outputs: bytes = b"", device: str = "cpu"
) -> wire.ResultReport:
    return wire.ResultReport(
        lease_token=job.lease_token,
        status=InvokeStatus.DONE,
        result=InvokeResult(
            outputs_format="npz",
            outputs_size=len(outputs),
            outputs_sha256=hashlib.sha256(outputs).hexdigest(),
            outputs_inline_base64=base64.b64encode(outputs).decode(),
            metrics=Metrics.model_validate({"device": device, "duration_ms": 1}),
        ),
    )


Behaviour = Callable[[wire.LeasedJob], Awaitable[wire.ResultReport]]


class SimulatedAgent:
    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        node_inventory: wire.NodeInventory | None = None,
    ) -> None:
        self.client = CoordinatorClient(base_url, transport=transport)
        self.inventory = node_inventory or inventory()
        self.node_id: str | None = None
        self.returning = False
        self.leased: list[str] = []
        self.reported: list[str] = []
        # Leases it holds, as `beating` tells the coordinator until it answers to drop one.
        self.holding: dict[str, wire.LeasedJob] = {}

    async def register(self, enrollment_token: str) -> str:
        result = await self.client.register(enrollment_token, self.inventory)
        self.client.key = result.node_key
        self.node_id = result.node_id
        self.returning = result.returning  # the machine was known: its node again
        return result.node_id

    async def heartbeat(
        self,
        running: list[wire.LeasedJob] = (),  # type: ignore[assignment]
        *,
        telemetry: Telemetry | None = None,
    ) -> wire.HeartbeatAck:
        return await self.client.heartbeat(
            wire.Heartbeat(
                running=[
                    wire.RunningLease(invoke_id=j.invoke_id, lease_token=j.lease_token)
                    for j in running
                ],
                telemetry=telemetry or Telemetry(),
            )
        )

    async def lease(
        self,
        slots: int = 1,
        wait: float = 0.0,
        free_gpus: int = 8,
        free_gpu_indices: list[int] | None = None,
        start: bool = False,
    ) -> list[wire.LeasedJob]:
        response = await self.client.lease(
            wire.LeaseRequest(
                slots=slots,
                free_gpus=free_gpus,
                free_gpu_indices=free_gpu_indices,
                wait_sec=wait,
                start=start,
            )
        )
        self.leased.extend(job.invoke_id for job in response.jobs)
        self.holding.update((job.invoke_id, job) for job in response.jobs)
        return response.jobs

    async def complete(self, job: wire.LeasedJob, outputs: bytes = b"sim-outputs") -> None:
        if not job.started:
            await self.client.start(job.invoke_id, job.lease_token)
        await self.client.report(job.invoke_id, done_report(job, outputs), retry_for=0)
        self.reported.append(job.invoke_id)

    async def serve(self, stop: asyncio.Event, behaviour: Behaviour | None = None) -> None:
        """Lease and complete jobs until `stop`; stale leases are dropped like the real agent."""
        while not stop.is_set():
            jobs = await self.lease(slots=self.inventory.max_concurrent_jobs, wait=0.5)
            for job in jobs:
                try:
                    await self.client.start(job.invoke_id, job.lease_token)
                    report = await behaviour(job) if behaviour else done_report(job)
                    await self.client.report(job.invoke_id, report, retry_for=0)
                    self.reported.append(job.invoke_id)
                except StaleLease:
                    continue

    @contextlib.asynccontextmanager
    async def beating(self, telemetry: Telemetry | None = None) -> AsyncIterator[None]:
        """Heartbeat in the background while the block runs, as the real agent's side task
        does: the node stays online however long a slow (loaded) test takes, and the leases
        it holds are extended until the coordinator answers to drop them. Each beat carries
        `telemetry`. A transient failure is beaten through; any other ends the beating and
        is raised when the block ends."""
        task = asyncio.create_task(self._beat_forever(telemetry))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _beat_forever(self, telemetry: Telemetry | None) -> None:
        while True:
            try:
                ack = await self.heartbeat(list(self.holding.values()), telemetry=telemetry)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                await asyncio.sleep(0.1)
                continue
            for status in ack.leases:
                if status.verdict is wire.LeaseVerdict.DROP:
                    self.holding.pop(status.invoke_id, None)
            await asyncio.sleep(ack.heartbeat_interval_sec)

    async def answer_challenge(self, how: ChallengeAnswer | None = None) -> Answered:
        """Take the challenge the heartbeat answer names and answer it `how` (honestly)."""
        order = (await self.heartbeat()).challenge
        assert order is not None, "no challenge waits for this node"
        return await answer(self.client, order, how or ChallengeAnswer())

    async def aclose(self) -> None:
        await self.client.aclose()


AgentFactory = Callable[..., Awaitable[SimulatedAgent]]
