"""Starts reservations whose time came and ends those whose period is over (SPEC §4.3).

Every replica runs it: activation is one guarded UPDATE, each end is claimed with
`SKIP LOCKED` and guarded by its status, and its charge is posted once by cause
(`services/rentals/reservation_billing.py`). Sessions opened in a reservation that is
over are closed by the replica holding them.
"""

from sqlalchemy import select

from gpu_share.coordinator.core.orm import ReservationRow, SessionRow
from gpu_share.coordinator.core.statuses import LIVE, OPEN_SESSION_VALUES
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.rentals import reservation_billing
from gpu_share.coordinator.services.sessions.sessions import Sessions


async def run_once(replica: Replica) -> reservation_billing.LoopReport:
    now = replica.clock.now()
    async with replica.db.write() as session:
        report = await reservation_billing.activate_and_end(session, now)
    held = [live.id for live in replica.hub.held()]
    if not held:
        return report
    async with replica.db.read() as session:
        over = (
            await session.execute(
                select(SessionRow.id, SessionRow.tenant_id)
                .join(ReservationRow, ReservationRow.id == SessionRow.reservation_id)
                .where(
                    SessionRow.id.in_(held),
                    SessionRow.status.in_(OPEN_SESSION_VALUES),
                    ReservationRow.status.not_in(LIVE),
                )
            )
        ).all()
    sessions = Sessions.of(replica)
    for session_id, tenant_id in over:
        await sessions.delete(tenant_id, session_id)
    return report
