"""Provider dashboard: benchmarks. Per machine and GPU the latest score with each figure
against its reference, whether it passed and why not, and the history of scores."""

from dataclasses import dataclass, field
from datetime import datetime

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.services.nodes import nodes
from gpu_share.coordinator.services.providers import benchmarks
from gpu_share.coordinator.web.pages import SignedProvider
from gpu_share.protocol.benchmarks import BenchmarkRun, GpuVerdict
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.providers import ProviderNode

router = APIRouter(prefix="/provider", include_in_schema=False)

HISTORY = 20  # runs per machine on the page


@dataclass
class GpuView:
    latest: GpuVerdict
    scores: list[float | None]  # oldest first, for the sparkline


@dataclass
class MachineView:
    node: ProviderNode
    runs: list[BenchmarkRun]  # newest first
    requested_at: datetime | None
    thresholds: benchmarks.Thresholds
    gpus: list[GpuView] = field(default_factory=list)

    @property
    def node_scores(self) -> list[float | None]:
        return [run.node.score for run in reversed(self.runs)]

    @property
    def latest(self) -> BenchmarkRun | None:
        return self.runs[0] if self.runs else None


def _machine(
    node: ProviderNode, runs: list[BenchmarkRun], requested_at: datetime | None
) -> MachineView:
    limits = benchmarks.GPU_THRESHOLDS if node.gpus else benchmarks.CPU_THRESHOLDS
    view = MachineView(node, runs, requested_at, limits[Tier(node.tier)])
    if not runs:
        return view
    oldest_first = list(reversed(runs))
    for verdict in runs[0].gpus:
        scores = [
            next((g.score for g in run.gpus if g.uuid == verdict.uuid), None)
            for run in oldest_first
        ]
        view.gpus.append(GpuView(verdict, scores))
    return view


@router.get("/benchmarks")
async def benchmarks_page(signed: SignedProvider) -> Response:
    browser, provider = signed
    replica = browser.replica
    async with replica.db.read() as session:
        machines = await nodes.of_provider(
            session, provider.provider_id, browser.now(), replica.settings
        )
        requested = await benchmarks.requested(session, [m.id for m in machines])
        views = [
            _machine(m, await benchmarks.history(session, m.id, HISTORY), requested.get(m.id))
            for m in machines
        ]
    return browser.render(
        "provider/benchmarks.html",
        machines=views,
        labels=benchmarks.LABELS,
    )
