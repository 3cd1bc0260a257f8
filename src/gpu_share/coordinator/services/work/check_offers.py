"""Which spot checks a node is offered, and what comes with one (docs/trust.md).

A spot check re-runs another node's job; it goes to a trusted node only
(`nodes.trusted`), never to the node that ran the job checked, and a check of a training
that ended done carries the outputs that node returned, for the trusted node to score.
Which jobs are checked, and what their results mean, is the trust domain's.
"""

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import ArtifactRow, InvokeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.nodes.trusted import TrustRule, is_trusted
from gpu_share.coordinator.services.work.artifact_refs import LeaseContext, artifact_ref
from gpu_share.coordinator.services.work.invokes import outputs_artifact_id
from gpu_share.protocol import agent as wire
from gpu_share.protocol.invokes import InvokeStatus
from gpu_share.protocol.runtimes import RuntimeName


def takes_checks(node: NodeRow, settings: Settings) -> bool:
    """This node may be offered spot checks of other nodes' jobs (it reads the row only)."""
    return is_trusted(node, TrustRule.of(settings))


def offered(checker: bool) -> str:
    """The queued invokes a node may take as far as spot checks go, as an SQL condition on
    `invokes` (the claim's candidates, `fair_share`): for a `checker`, every invoke but
    the checks of jobs node `:node_id` ran; for any other node, no check."""
    if not checker:
        return "invokes.check_of IS NULL"
    return (
        "(invokes.check_of IS NULL OR NOT EXISTS (SELECT 1 FROM invokes AS checked"
        " WHERE checked.id = invokes.check_of AND checked.node_id = :node_id))"
    )


async def evaluated_outputs(
    session: AsyncSession, runtime: str, check_of: str, now: datetime, ctx: LeaseContext
) -> wire.EvaluatedOutputs | None:
    """For a spot check (of invoke `check_of`) of a training that ended done: the outputs
    its node returned.
    Inline, or the tenant's outputs artifact its URL names; None when there is nothing of
    the tenant's to score (the check then finds the outputs missing)."""
    if RuntimeName(runtime).kind != "train":
        return None
    checked = await session.get(InvokeRow, check_of)
    if checked is None or checked.status != InvokeStatus.DONE.value or not checked.result:
        return None
    inline = checked.result.get("outputs_inline_base64")
    if isinstance(inline, str) and inline:
        return wire.EvaluatedOutputs(inline_base64=inline)
    artifact_id = outputs_artifact_id(checked.result)
    artifact = None if artifact_id is None else await session.get(ArtifactRow, artifact_id)
    if artifact is None or artifact.tenant_id != checked.tenant_id:
        return None
    ref = await artifact_ref(session, "", artifact.id, None, now, ctx)
    return None if ref is None else wire.EvaluatedOutputs(artifact=ref)
