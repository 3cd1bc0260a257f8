"""Spot checks on the wire (docs/trust.md, "Spot checks", "When a node is caught").

GET  /v1/admin/trust/incidents[?node_id=]      → [TrustIncident] with their evidence
GET  /v1/admin/trust/incidents/{id}            → TrustIncident
POST /v1/admin/nodes/{id}/trusted  TrustedMark → NodeTrust
GET  /v1/provider/trust/incidents              → [TrustIncident] (no evidence: the
                                                  tenant's job and data are not theirs)
"""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class TrustIncident(BaseModel):
    id: str
    node_id: str
    provider_id: str
    kind: str = Field(
        description="result_mismatch (outputs unlike the trusted node's) or "
        "failure_not_reproduced (a failure the trusted node did not have)"
    )
    reason: str = Field(description="What differed, in one sentence")
    invoke_id: str | None = Field(default=None, description="The job checked")
    check_invoke_id: str | None = Field(default=None, description="The check that confirmed it")
    refunded: str = Field(description="USDC refunded to tenants for the node's jobs")
    forfeited: str = Field(description="USDC of the provider's held earnings forfeited")
    created_at: datetime
    evidence: dict[str, Any] | None = Field(
        default=None,
        description="Both results as they came, the inputs' hashes, what the comparisons "
        "found (admins only)",
    )


class TrustedMark(BaseModel):
    trusted: bool = Field(description="Whether the node runs the spot checks of other nodes")


class NodeTrust(BaseModel):
    node_id: str
    marked_trusted: bool = Field(description="An admin marked it trusted (the platform's own)")
    trusted: bool = Field(
        description="It takes spot checks now: marked, or on its record (verified Enterprise, "
        "a long clean record, high reliability); never while quarantined"
    )
    quarantined_at: datetime | None = None
    spot_check_rate: float | None = Field(
        default=None, description="The share of its jobs checked (trusted nodes: none are)"
    )
    spot_checks: dict[str, Any] = Field(
        default_factory=dict, description="Its record: per runtime, checks and their outcomes"
    )
