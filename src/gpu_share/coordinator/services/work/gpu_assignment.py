"""Which of a node's GPUs a job gets (SPEC §4.3, multi-GPU): whole GPUs, by NVML index.

A GPU job asking for `gpus: N` is leased only to a node with N free GPUs that match it;
the coordinator names them in the lease (`LeasedJob.gpu_indices`) and records them on the
invoke (`invokes.gpu_indices`), so the next claim on that node knows they are taken. A
GPU is free when no active (assigned or running) invoke and no open session asking for
whole GPUs (`gpu_sessions.gpu_indices`) on the node holds it and, for an agent that says
which of its GPUs are free, the agent agrees. Sessions with `gpus: N` get theirs here too.

Other sessions do not hold whole GPUs: they hold memory (`memory_fit`), on the node's
first GPU (the agent loads them there). A job is given that GPU last.

Among the free GPUs, a multi-GPU job gets the set best linked by NVLink, as the node's
topology (`nodes.gpu_topology`) tells; without one, the lowest indices.
"""

from collections.abc import Iterable
from itertools import combinations
from math import comb
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, SessionRow
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES, OPEN_SESSION_VALUES
from gpu_share.coordinator.services.nodes.placement import Requirements, gpu_matches, listed_gpu

EXHAUSTIVE_UP_TO = 5000  # candidate sets weighed one by one; above this, a greedy choice


async def held_indices(session: AsyncSession, node_id: str) -> set[int]:
    """GPUs of the node that its active invokes and its whole-GPU sessions hold now."""
    rows = await session.scalars(
        select(InvokeRow.gpu_indices).where(
            InvokeRow.node_id == node_id,
            InvokeRow.status.in_(ACTIVE_VALUES),
            InvokeRow.gpu_indices.is_not(None),
        )
    )
    held = {int(index) for indices in rows.all() if indices for index in indices}
    return held | (await session_held(session, node_id)).get(node_id, set())


async def session_held(session: AsyncSession, node_id: str | None = None) -> dict[str, set[int]]:
    """GPUs that open whole-GPU sessions hold, per node (one node, or all)."""
    query = select(SessionRow.node_id, SessionRow.gpu_indices).where(
        SessionRow.status.in_(OPEN_SESSION_VALUES),
        SessionRow.gpus > 0,
        SessionRow.node_id.is_not(None),
    )
    if node_id is not None:
        query = query.where(SessionRow.node_id == node_id)
    found: dict[str, set[int]] = {}
    for node, indices in (await session.execute(query)).all():
        found.setdefault(str(node), set()).update(int(i) for i in indices or [])
    return found


def nvlink_counts(node: NodeRow) -> dict[frozenset[int], int]:
    """NVLink links between each pair of the node's GPUs, as its agent reported them."""
    links = (node.gpu_topology or {}).get("links") or []
    counts: dict[frozenset[int], int] = {}
    for link in links:
        if isinstance(link, dict) and link.get("kind") == "nvlink":
            pair = frozenset((int(link.get("a", -1)), int(link.get("b", -1))))
            counts[pair] = max(1, int(link.get("nvlinks") or 0))
    return counts


def free_matching(
    node: NodeRow,
    req: Requirements,
    held: set[int],
    agent_free: set[int] | None,
) -> list[int]:
    """Indices of the node's GPUs this job could have now, in the order they are offered."""
    indices: list[int] = []
    for gpu in node.gpus:
        index = _index(gpu)
        if index is None or index in held or index in indices:
            continue
        if agent_free is not None and index not in agent_free:
            continue
        if gpu_matches(node, gpu, req):
            indices.append(index)
    first = min((i for g in node.gpus if (i := _index(g)) is not None), default=None)
    # The first GPU holds the node's sessions: give it last.
    return sorted(indices, key=lambda i: (i == first, i))


def choose(
    node: NodeRow,
    req: Requirements,
    held: set[int],
    agent_free: set[int] | None = None,
) -> list[int] | None:
    """The GPUs to give a job needing `req.gpus` of them; None when the node lacks that many.

    A CPU job gets none (an empty list)."""
    if not req.runtime.needs_gpu:
        return []
    free = free_matching(node, req, held, agent_free)
    if len(free) < req.gpus:
        return None
    links = nvlink_counts(node)
    if req.gpus == 1 or not links:
        return sorted(free[: req.gpus])
    return sorted(_best_linked(free, req.gpus, links))


def _best_linked(free: list[int], count: int, links: dict[frozenset[int], int]) -> list[int]:
    """The `count` GPUs with the most NVLink between them (ties: the order offered)."""

    def weight(group: Iterable[int]) -> tuple[int, int]:
        pairs = list(combinations(group, 2))
        linked = sum(1 for pair in pairs if frozenset(pair) in links)
        return (linked, sum(links.get(frozenset(pair), 0) for pair in pairs))

    if comb(len(free), count) <= EXHAUSTIVE_UP_TO:
        # combinations() yields in the offered order, and max() keeps the first best.
        return list(max(combinations(free, count), key=weight))
    group = [free[0]]
    while len(group) < count:
        rest = [i for i in free if i not in group]
        group.append(max(rest, key=lambda i: weight((*group, i))))
    return group


def _index(gpu: dict[str, Any]) -> int | None:
    value = gpu.get("index")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def nvlinked(node: NodeRow, count: int) -> bool:
    """The node has `count` listed GPUs (at least two) each linked to each other by NVLink."""
    links = nvlink_counts(node)
    if not links:
        return False
    listed = [i for gpu in node.gpus if listed_gpu(node, gpu) and (i := _index(gpu)) is not None]
    size = max(count, 2)
    if len(listed) < size:
        return False
    group = _best_linked(sorted(set(listed)), size, links)
    return all(frozenset(pair) in links for pair in combinations(group, 2))
