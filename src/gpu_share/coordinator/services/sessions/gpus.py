"""Which GPUs a session gets (SPEC §1.7, §4.3; docs/placement.md, Multi-GPU).

A session asking for `gpus: N` holds N whole GPUs of one node from placement to close,
chosen by `gpu_assignment` like an invoke's: free of active invokes, of other whole-GPU
sessions and of others' reservations in force. A session naming a reservation gets the
reservation's GPUs only: N whole ones, or (`gpus: 0`) the first of them to load on,
shared by memory. Other sessions (`gpus: 0`) hold no GPU: the agent loads them on the
node's first GPU, so a node whose first GPU a whole-GPU session holds takes none.
"""

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import Unavailable
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes.placement import Requirements
from gpu_share.coordinator.services.work import gpu_assignment, reservation_holds
from gpu_share.protocol.errors import ErrorCode


def first_index(node: NodeRow) -> int | None:
    return min((int(gpu.get("index", n)) for n, gpu in enumerate(node.gpus)), default=None)


async def choose(
    session: AsyncSession,
    node: NodeRow,
    req: Requirements,
    holds: list[reservation_holds.Held],
    reservation_id: str | None = None,
    *,
    lock: bool = False,
) -> list[int] | None:
    """The `req.gpus` whole GPUs of this node a session may hold now; None when too few
    are free. `lock`: first lock the node's row, as a claim writing it does, so that
    two placements on the node cannot both take the same GPUs (PostgreSQL; SQLite
    serializes write transactions)."""
    if lock:
        await session.execute(select(NodeRow.id).where(NodeRow.id == node.id).with_for_update())
    held = await gpu_assignment.held_indices(session, node.id)
    taken = held | reservation_holds.off_limits(node, holds, reservation_id)
    return gpu_assignment.choose(node, req, taken)


async def in_reservation(
    session: AsyncSession,
    node: NodeRow,
    req: Requirements,
    whole: int,
    holds: list[reservation_holds.Held],
    reservation_id: str,
) -> list[int]:
    """The reservation's GPUs a session of it gets: `whole` free ones, or to share, the
    first of them no whole-GPU session holds (else its first)."""
    own = next((held for held in holds if held.reservation_id == reservation_id), None)
    mine = sorted(own.gpu_indices) if own is not None else []
    if whole == 0:
        held = (await gpu_assignment.session_held(session, node.id)).get(node.id, set())
        return [next((i for i in mine if i not in held), mine[0])] if mine else []
    indices = await choose(session, node, req, holds, reservation_id, lock=True)
    if indices is None:
        raise Unavailable(
            f"reservation {reservation_id} has fewer than {whole} GPU(s) free now: its own "
            "invokes and sessions hold the others; retry when they finish",
            code=ErrorCode.NO_CAPACITY,
            details={"constraint": "gpus", "reservation_id": reservation_id},
            headers={"Retry-After": "30"},
        )
    return indices


def none_free(req: Requirements) -> Unavailable:
    """503 when nodes serve the session but none has its GPUs free now."""
    return Unavailable(
        f"no node that serves {req.runtime.value} has {req.gpus} GPU(s) free now (invokes, "
        "sessions or reservations hold them); retry later or ask for fewer",
        code=ErrorCode.NO_CAPACITY,
        details={"constraint": "gpus"},
        headers={"Retry-After": "30"},
    )


def first_gpu_held(node: NodeRow, session_held: dict[str, set[int]]) -> bool:
    """A whole-GPU session holds the node's first GPU: it takes no memory-sharing session."""
    return first_index(node) in session_held.get(node.id, set())
