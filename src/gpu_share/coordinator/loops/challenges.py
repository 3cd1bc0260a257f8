"""Hardware challenges: end those whose deadline passed, then issue the ones due.

Which nodes are due is read in one read transaction; each issue is its own short write
transaction that locks the node and re-checks, so replicas running this at once issue
one challenge per node, never two.
"""

from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.trust import challenges, verdicts


async def run_once(replica: Replica) -> None:
    settings = replica.settings
    async with replica.db.write() as session:
        await verdicts.expire_overdue(session, replica.clock.now(), settings)
    async with replica.db.read() as session:
        due = await challenges.nodes_due(session, replica.clock.now(), settings)
    for node_id in due:
        async with replica.db.write() as session:
            await challenges.issue_due(session, node_id, replica.clock.now(), settings)
