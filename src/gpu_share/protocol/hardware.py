"""Proven hardware as providers and admins read it (docs/trust.md, "Declared and proven").

A machine's GPUs (or a CPU node's cores) are proven one by one by hardware challenges
(`HardwareProof`); what a provider's machines proved, counted per GPU model, is set
against what their approved application declared (`ProviderHardware`,
`GET /v1/provider/hardware`), and every difference is one short line.
"""

from datetime import datetime

from pydantic import BaseModel, Field


class HardwareProof(BaseModel):
    """What hardware challenges proved of one GPU of a machine, or of a CPU node's cores."""

    target: str = Field(description='The GPU\'s UUID, or "cpu"')
    claimed: str | None = Field(
        description="The catalog model the GPU claims to be (a CPU node: its cores); null: "
        "a GPU the catalog does not know, which no challenge can prove"
    )
    verified: bool
    verified_at: datetime | None = Field(description="When its latest challenge passed")


class ModelCount(BaseModel):
    model: str = Field(description="The catalog model's name, or '<name> (other)'")
    count: int


class ProviderHardware(BaseModel):
    """What the provider's approved application declared against what their machines
    proved; tier advantages (Enterprise) go by what is proven."""

    declared: list[ModelCount] | None = Field(
        description="GPUs per model, as the approved application said; null: no application "
        "(an admin made the provider), so nothing to compare with"
    )
    proven: list[ModelCount] = Field(
        description="GPUs per model that passed a hardware challenge, over all the provider's "
        "machines but quarantined ones"
    )
    mismatches: list[str] = Field(
        description='Each difference in a line, e.g. "declared 8 × NVIDIA H100 80GB, proven 2"'
    )
