"""Declared and proven hardware (docs/trust.md): what a provider's approved application said
they would connect, GPUs per model, against what their machines proved in hardware
challenges (`placement.gpu_proof`).

A difference is not a verdict: a provider may not have connected everything yet, or may
have grown. It is shown to the provider and the admin, each in a short line, and nothing
is granted on the application's word: the Enterprise tier's advantages go by proven
hardware (`ranking`, `money/earnings_hold`). A quarantined machine proves nothing here.
A variant (an H100 PCIe) counts as the model an application names for it (an H100 80GB).
"""

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import NodeRow, ProviderApplicationRow
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.services.nodes.placement import gpu_proof
from gpu_share.protocol.hardware import ModelCount, ProviderHardware
from gpu_share.protocol.provider_applications import ApplicationStatus, GpuEntry


def declared_of(entries: Iterable[Any]) -> Counter[str]:
    """GPUs per model name, as application GPU entries (`ProviderApplicationRow.gpus`)
    give them; an entry that is not one (stored by another version) counts for nothing."""
    found: Counter[str] = Counter()
    for raw in entries:
        try:
            entry = GpuEntry.model_validate(raw)
        except ValidationError:
            continue
        found[gpu_catalog.display_name(entry.model, entry.other_model)] += entry.count
    return found


def proven_of(nodes: Iterable[NodeRow]) -> Counter[str]:
    """Proven GPUs per model, as an application would name it, over machines not
    quarantined."""
    found: Counter[str] = Counter()
    for node in nodes:
        if node.quarantined_at is not None:
            continue
        for gpu in node.gpus:
            proof = gpu_proof(node, gpu)
            if proof is not None:
                found[gpu_catalog.as_applied(str(proof["model"]))] += 1
    return found


def mismatches(declared: Counter[str], proven: Counter[str]) -> list[str]:
    """One line per difference, declared models first (as declared), then the proven
    models no application named."""
    lines = [
        f"declared {count} × {model}, proven {proven.get(model, 0)}"
        for model, count in declared.items()
        if proven.get(model, 0) != count
    ]
    lines += [
        f"proven {count} × {model}, not declared"
        for model, count in sorted(proven.items())
        if model not in declared
    ]
    return lines


def compare(applications: Sequence[Iterable[Any]], nodes: Iterable[NodeRow]) -> ProviderHardware:
    """`applications`: the GPU entries of each approved application of the provider; none
    (a provider an admin made) leaves nothing to compare with."""
    proven = proven_of(nodes)
    if not applications:
        return ProviderHardware(declared=None, proven=_counts(proven), mismatches=[])
    declared = declared_of(entry for entries in applications for entry in entries)
    return ProviderHardware(
        declared=_counts(declared), proven=_counts(proven), mismatches=mismatches(declared, proven)
    )


def _counts(counts: Counter[str]) -> list[ModelCount]:
    return [ModelCount(model=model, count=count) for model, count in counts.items()]


async def of_providers(
    session: AsyncSession, provider_ids: Sequence[str] | None = None
) -> dict[str, ProviderHardware]:
    """Declared against proven for these providers (None: every provider with a machine
    or an approved application), in two statements whatever their number."""
    applications = select(ProviderApplicationRow.provider_id, ProviderApplicationRow.gpus).where(
        ProviderApplicationRow.status == ApplicationStatus.APPROVED.value,
        ProviderApplicationRow.provider_id.is_not(None),
    )
    machines = select(NodeRow)
    if provider_ids is not None:
        applications = applications.where(ProviderApplicationRow.provider_id.in_(provider_ids))
        machines = machines.where(NodeRow.provider_id.in_(provider_ids))
    entries: dict[str, list[list[Any]]] = {}
    for provider_id, gpus in (await session.execute(applications)).all():
        entries.setdefault(str(provider_id), []).append(list(gpus or []))
    nodes: dict[str, list[NodeRow]] = {}
    for node in (await session.scalars(machines)).all():
        nodes.setdefault(node.provider_id, []).append(node)
    wanted = provider_ids if provider_ids is not None else sorted({*entries, *nodes})
    return {
        provider_id: compare(entries.get(provider_id, []), nodes.get(provider_id, []))
        for provider_id in wanted
    }


async def of_provider(session: AsyncSession, provider_id: str) -> ProviderHardware:
    return (await of_providers(session, [provider_id]))[provider_id]
