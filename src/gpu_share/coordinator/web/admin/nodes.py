"""The providers with their machines at a glance, every node by status (or one provider's,
with its enrollment tokens), what hardware challenges proved of them against what the
providers declared, and asking a node to benchmark itself again."""

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.services.nodes import nodes, proofs
from gpu_share.coordinator.services.platform import overview
from gpu_share.coordinator.services.providers import (
    benchmarks,
    declared_hardware,
    providers,
)
from gpu_share.coordinator.services.trust import challenge_status, incidents
from gpu_share.coordinator.web import enrollment
from gpu_share.coordinator.web.admin.forms import not_found
from gpu_share.coordinator.web.pages import Browser, SignedAdmin, form_of
from gpu_share.protocol.nodes import NodeStatus
from gpu_share.protocol.providers import IssuedEnrollmentToken

router = APIRouter(prefix="/admin", include_in_schema=False)

NODE_ORDER = {NodeStatus.ONLINE: 0, NodeStatus.BUSY: 1, NodeStatus.OFFLINE: 2}


@router.get("/providers")
async def providers_page(signed: SignedAdmin) -> Response:
    browser, _ = signed
    replica = browser.replica
    async with replica.db.read() as db:
        listed = await overview.provider_summaries(db, browser.now(), replica.settings)
        hardware = await declared_hardware.of_providers(db, [p.id for p in listed])
    return browser.render("admin/providers.html", providers=listed, hardware=hardware)


async def nodes_view(
    browser: Browser,
    provider: str = "",
    *,
    issued: IssuedEnrollmentToken | None = None,
    token_errors: dict[str, str] | None = None,
    status: int = 200,
) -> Response:
    """Every node, or one provider's with its enrollment tokens (one just issued shown this
    once, or the refusal of a token action)."""
    replica = browser.replica
    try:
        if provider and not is_id("prv", provider):
            raise NotFound(f"provider {provider} does not exist")
        async with replica.db.read() as db:
            listed = await nodes.list_nodes(
                db, browser.now(), replica.settings, include_barred=True
            )
            owners = await overview.node_owners(db)
            trust = await proofs.trust_by_node(db)
            challenges = await challenge_status.latest_by_target(db, [n.id for n in listed])
            spot = await incidents.node_trusts(db, replica.settings)
            of = await providers.get(db, provider) if provider else None
            hardware = await declared_hardware.of_provider(db, provider) if of else None
    except NotFound as exc:
        return not_found(browser, exc.message)
    tokens: dict[str, Any] = {}
    if of is not None:
        listed = [n for n in listed if owners[n.id].provider_id == of.id]
        tokens = await enrollment.section(
            browser,
            of.id,
            forms_at=f"/admin/providers/{of.id}/enrollment-tokens",
            ask_lifetime=True,
            issued=issued,
            errors=token_errors,
        )
    listed.sort(key=lambda n: (NODE_ORDER.get(n.status, 3), owners[n.id].name, n.id))
    return browser.render(
        "admin/nodes.html",
        status=status,
        nodes=listed,
        owners=owners,
        trust=trust,
        challenges=challenges,
        spot=spot,
        hardware=hardware,
        provider=of,
        **tokens,
    )


@router.get("/nodes")
async def nodes_page(signed: SignedAdmin, provider: str = "") -> Response:
    browser, _ = signed
    return await nodes_view(browser, provider)


@router.post("/nodes/{node_id}/benchmark")
async def request_benchmark(node_id: str, signed: SignedAdmin) -> Response:
    """The node benchmarks itself when next idle; its heartbeat answers say so till then."""
    browser, _ = signed
    await form_of(browser)
    try:
        if not is_id("nod", node_id):
            raise NotFound(f"node {node_id} does not exist")
        async with browser.replica.db.write() as db:
            await benchmarks.request(db, node_id, browser.now())
    except NotFound as exc:
        return not_found(browser, exc.message)
    return browser.redirect(
        f"/admin/nodes#{node_id}",
        flash=f"Benchmarks requested for node {node_id}: it runs them once it has no job "
        "and no session, and reports the scores.",
    )
