"""Whether work fits in a node's memory beside the sessions it holds (SPEC §4.1).

One place for the rules: what a session reserves, what a GPU job needs, how much a
node has. A session holds its reservation from placement to close; GPU invokes are
leased only into what the sessions leave free.
"""

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import NodeRow, SessionRow
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.sessions import OPEN_SESSION_STATUSES

MIB = 1024 * 1024
MIN_SESSION_RESERVATION_MB = 256
MIN_GPU_JOB_MB = 256
LOADED_MODEL_FACTOR = 4  # weights, arena and buffers: a loaded model takes its size this often


def gpu_memory_mb(node: NodeRow) -> int:
    return sum(int(g.get("vram_mb", 0)) for g in node.gpus)


def capacity_mb(node: NodeRow, needs_gpu: bool) -> int:
    """What sessions may reserve on a node: its GPU memory, or half its RAM for CPU models."""
    return gpu_memory_mb(node) if needs_gpu else node.ram_mb // 2


def session_reservation_mb(model_bytes: int | None, min_vram_mb: int | None) -> int:
    reserve = max(MIN_SESSION_RESERVATION_MB, LOADED_MODEL_FACTOR * (model_bytes or 0) // MIB)
    return max(reserve, min_vram_mb or 0)


def gpu_job_fits(runtime: RuntimeName, min_vram_mb: int | None, free_vram_mb: int) -> bool:
    """A GPU invoke fits when what it asked for (or a floor) is left free by sessions."""
    if not runtime.needs_gpu:
        return True
    return free_vram_mb >= (min_vram_mb or MIN_GPU_JOB_MB)


async def session_reservations(session: AsyncSession) -> dict[str, int]:
    """Memory (MB) the open sessions hold on each node."""
    open_values = [s.value for s in OPEN_SESSION_STATUSES]
    rows = await session.execute(
        select(SessionRow.node_id, func.sum(SessionRow.reserved_mb))
        .where(SessionRow.status.in_(open_values), SessionRow.node_id.is_not(None))
        .group_by(SessionRow.node_id)
    )
    return {node_id: int(total or 0) for node_id, total in rows.all() if node_id}
