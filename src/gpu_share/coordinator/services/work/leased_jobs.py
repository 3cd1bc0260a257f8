"""One queued invoke leased to a node (SPEC §4.1): its files as the agent fetches them
(`artifact_refs`), the price fixed on the work (`billing`), the guarded write that makes
the lease (`invoke_state.assign`), and the `LeasedJob` the agent gets. Which invokes a
node gets is `claims`'; what happens to a lease afterwards is `leases`'.
"""

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.driver_sql import Row as DriverRow
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.money import billing
from gpu_share.coordinator.services.work import check_offers, invoke_state
from gpu_share.coordinator.services.work.artifact_refs import (
    LeaseContext,
    StoredArtifact,
    artifact_ref,
)
from gpu_share.coordinator.services.work.invoke_state import Lease
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import OutputsUpload, Priority
from gpu_share.protocol.runtimes import RuntimeName


@dataclass(frozen=True, slots=True)
class Queued:
    """A queued invoke as a claim leases it: read and locked on the driver (`claims`)."""

    id: str
    tenant_id: str
    runtime: str
    priority: str
    gpus: int
    constraints: dict[str, Any]
    timeout_sec: int
    attempts: int
    reservation_id: str | None
    check_of: str | None
    gpu_indices: list[int] | None
    model_url: str
    model_artifact_id: str | None
    model_sha256: str | None
    inputs_url: str
    inputs_artifact_id: str | None
    inputs_sha256: str | None
    checkpoint_artifact_id: str | None
    outputs_upload: dict[str, Any] | None

    @classmethod
    def of(cls, row: DriverRow) -> "Queued":
        return cls(*(row[name] for name in QUEUED_COLUMNS))


QUEUED_COLUMNS = tuple(field.name for field in fields(Queued))


async def lease_invoke(
    session: AsyncSession,
    row: Queued,
    node: NodeRow,
    now: datetime,
    ctx: LeaseContext,
    gpu_indices: list[int],
    *,
    artifacts: Mapping[str, StoredArtifact],
    start: bool = False,
) -> wire.LeasedJob | None:
    """Lease one invoke to the node, on `gpu_indices` of its GPUs (none for a CPU job);
    with `start`, the lease is its start (`LeaseRequest.start`). `artifacts`: those the
    invoke uses, by id (`artifact_refs.load_artifacts`). None: not leased (an artifact
    expired and the invoke failed, or another actor changed the row first)."""
    node_id = node.id
    model = await artifact_ref(
        session, row.model_url, row.model_artifact_id, row.model_sha256, now, ctx, artifacts
    )
    inputs = (
        await artifact_ref(
            session, row.inputs_url, row.inputs_artifact_id, row.inputs_sha256, now, ctx, artifacts
        )
        if row.inputs_url
        else None
    )
    checkpoint = (
        await artifact_ref(session, "", row.checkpoint_artifact_id, None, now, ctx, artifacts)
        if row.checkpoint_artifact_id
        else None
    )
    if model is None or (row.inputs_url and inputs is None):
        await invoke_state.fail_queued(
            session,
            row.id,
            ErrorCode.ARTIFACT_EXPIRED,
            "an artifact this invoke uses expired before a node could start it",
            now,
        )
        return None
    lease = Lease(row.id, node_id, secrets.token_hex(16))
    expires = now + timedelta(seconds=ctx.settings.lease_ttl_sec)
    attempt = row.attempts + 1
    rate = (
        await billing.placed_rate(
            session, node, gpus=row.gpus, spot=row.priority == Priority.SPOT.value
        )
        if billing.prepaid(ctx.settings) and row.reservation_id is None and row.check_of is None
        # free billing, a reservation's work (the reservation is billed), a spot check (the
        # platform's): nothing
        else 0
    )
    if not await invoke_state.assign(
        session,
        row.id,
        lease,
        attempt=attempt,
        expires_at=expires,
        now=now,
        rate_micro_per_hour=rate,
        gpu_indices=gpu_indices or None,
        start_timeout_sec=row.timeout_sec if start else None,
    ):
        return None
    return wire.LeasedJob(
        invoke_id=row.id,
        lease_token=lease.token,
        lease_expires_at=expires,
        attempt=attempt,
        runtime=RuntimeName(row.runtime),
        model=model,
        inputs=inputs,
        timeout_sec=row.timeout_sec,
        gpus=row.gpus,
        outputs_upload=OutputsUpload.model_validate(row.outputs_upload)
        if row.outputs_upload
        else None,
        inline_limit_bytes=ctx.settings.inline_output_limit_bytes,
        checkpoint=checkpoint,
        gpu_indices=gpu_indices or None,
        started=start,
        evaluate=await check_offers.evaluated_outputs(session, row.runtime, row.check_of, now, ctx)
        if row.check_of is not None
        else None,
    )
