"""The published reliability score (SPEC §3.7; the formula is docs/reliability.md).

A node's score, or a provider's over all its nodes, with its three components and the
evidence behind each, as the coordinator last computed it. Tenants see it on nodes and
offers (`reliability`), providers on `GET /v1/provider/reliability` and their
Performance tab. Every value is in [0, 1]; higher is better.
"""

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field

Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class UptimeEvidence(BaseModel):
    """Time inside the declared weekly windows only: time outside them is not counted."""

    hours_in_windows: float = Field(
        ge=0, description="Declared window time in the lookback since the node registered"
    )
    hours_online: float = Field(ge=0, description="Of those, hours with a heartbeat")
    weighted_hours: float = Field(ge=0, description="hours_in_windows, each hour decayed")
    weighted_offline_hours: float = Field(ge=0, description="Offline window hours, decayed")


class CompletionEvidence(BaseModel):
    """Jobs and sessions the node finished or lost; tenant-side failures are not counted."""

    jobs_counted: int = Field(ge=0, description="Completed plus failed for provider-side causes")
    jobs_completed: int = Field(ge=0)
    provider_failures: int = Field(
        ge=0, description="Lost node, expired lease, agent error (docs/reliability.md)"
    )
    weighted_jobs: float = Field(ge=0)
    weighted_failures: float = Field(ge=0)
    last_failure_at: datetime | None = None


class StabilityEvidence(BaseModel):
    """Benchmark runs in the lookback against the node's first run."""

    runs_counted: int = Field(
        ge=0, description="Runs measured against the first (the first run itself is not one)"
    )
    baseline_at: datetime | None = Field(default=None, description="When the first run finished")
    latest_drop: Fraction | None = Field(
        default=None, description="The latest run's counted drop from the first"
    )
    worst_drop: Fraction | None = None
    weighted_runs: float = Field(ge=0)
    weighted_drop: float = Field(ge=0)


class Reliability(BaseModel):
    """score = 0.4 × uptime + 0.4 × completion + 0.2 × stability."""

    score: Fraction = Field(description="The published score")
    uptime: Fraction = Field(description="Online during the declared windows")
    completion: Fraction = Field(description="Jobs not interrupted by provider-side causes")
    stability: Fraction = Field(description="Benchmark scores holding up against the first run")
    uptime_evidence: UptimeEvidence
    completion_evidence: CompletionEvidence
    stability_evidence: StabilityEvidence
    nodes: int = Field(default=1, ge=0, description="Nodes combined (a provider's score)")
    start: Fraction | None = Field(
        default=None,
        description="A node's: the score it started from, its provider's published score "
        "when it registered (0.9 when the provider had none); null on a provider's score",
    )
    half_life_days: float = Field(gt=0, description="Evidence this old weighs half")
    lookback_days: float = Field(gt=0, description="Evidence older than this is not counted")
    computed_at: datetime


class ReliabilityPoint(BaseModel):
    """The score as it stood at the end of one day, computed the same way."""

    at: datetime
    score: Fraction
    uptime: Fraction
    completion: Fraction
    stability: Fraction


class NodeReliability(BaseModel):
    node_id: str
    hostname: str
    label: str | None = Field(default=None, description="Its provider's name for it")
    reliability: Reliability | None = Field(description="Null until first computed")


class ProviderReliability(BaseModel):
    """`GET /v1/provider/reliability`: the provider's own score and each of its nodes'."""

    provider: Reliability | None = Field(description="Null while the provider has no node")
    nodes: list[NodeReliability]


def percent_text(fraction: float) -> str:
    """A score as people read it, for pages and error messages (the wire keeps the
    fraction): 0.9333 → "93.3 %", 0.9 → "90 %"."""
    return f"{fraction * 100:.1f}".removesuffix(".0") + " %"
