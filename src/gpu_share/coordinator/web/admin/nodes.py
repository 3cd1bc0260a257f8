"""The providers with their machines at a glance, every node by status (or one provider's),
and asking a node to benchmark itself again."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.services.nodes import nodes
from gpu_share.coordinator.services.platform import overview
from gpu_share.coordinator.services.providers import benchmarks, providers
from gpu_share.coordinator.web.admin.forms import not_found
from gpu_share.coordinator.web.pages import SignedAdmin, form_of
from gpu_share.protocol.nodes import NodeStatus

router = APIRouter(prefix="/admin", include_in_schema=False)

NODE_ORDER = {NodeStatus.ONLINE: 0, NodeStatus.BUSY: 1, NodeStatus.OFFLINE: 2}


@router.get("/providers")
async def providers_page(signed: SignedAdmin) -> Response:
    browser, _ = signed
    replica = browser.replica
    async with replica.db.read() as db:
        listed = await overview.provider_summaries(db, browser.now(), replica.settings)
    return browser.render("admin/providers.html", providers=listed)


@router.get("/nodes")
async def nodes_page(signed: SignedAdmin, provider: str = "") -> Response:
    browser, _ = signed
    replica = browser.replica
    try:
        if provider and not is_id("prv", provider):
            raise NotFound(f"provider {provider} does not exist")
        async with replica.db.read() as db:
            listed = await nodes.list_nodes(db, browser.now(), replica.settings)
            owners = await overview.node_owners(db)
            of = await providers.get(db, provider) if provider else None
    except NotFound as exc:
        return not_found(browser, exc.message)
    if of is not None:
        listed = [n for n in listed if owners[n.id].provider_id == of.id]
    listed.sort(key=lambda n: (NODE_ORDER.get(n.status, 3), owners[n.id].hostname, n.id))
    return browser.render("admin/nodes.html", nodes=listed, owners=owners, provider=of)


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
