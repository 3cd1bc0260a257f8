"""Spot checks for the admin (docs/trust.md): the nodes caught, each with its evidence (both
results as they came, the inputs' hashes, what the comparisons found), and marking the
platform's own machines trusted from the nodes page."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.ids import is_id
from gpu_share.coordinator.services.trust import incidents
from gpu_share.coordinator.web.admin.forms import not_found
from gpu_share.coordinator.web.pages import SignedAdmin, form_of, text

router = APIRouter(prefix="/admin", include_in_schema=False)


@router.get("/incidents")
async def incidents_page(signed: SignedAdmin) -> Response:
    browser, _ = signed
    async with browser.replica.db.read() as db:
        listed = await incidents.listed(db)
    return browser.render("admin/incidents.html", incidents=listed)


@router.get("/incidents/{incident_id}")
async def incident_page(incident_id: str, signed: SignedAdmin) -> Response:
    browser, _ = signed
    try:
        if not is_id("inc", incident_id):
            raise NotFound(f"incident {incident_id} does not exist")
        async with browser.replica.db.read() as db:
            incident = await incidents.get(db, incident_id)
    except NotFound as exc:
        return not_found(browser, exc.message)
    return browser.render("admin/incident.html", incident=incident, e=incident.evidence or {})


@router.post("/nodes/{node_id}/trusted")
async def mark_trusted(node_id: str, signed: SignedAdmin) -> Response:
    """The form on the nodes page: `trusted` is "on" or "off"."""
    browser, _ = signed
    form = await form_of(browser)
    trusted = text(form, "trusted") == "on"
    try:
        if not is_id("nod", node_id):
            raise NotFound(f"node {node_id} does not exist")
        async with browser.replica.db.write() as db:
            await incidents.mark_trusted(db, node_id, trusted, browser.replica.settings)
    except NotFound as exc:
        return not_found(browser, exc.message)
    return browser.redirect(
        f"/admin/nodes#{node_id}",
        flash=f"Node {node_id} "
        + (
            "is trusted: it runs other nodes' spot checks and is not checked itself."
            if trusted
            else "is no longer marked trusted."
        ),
    )
