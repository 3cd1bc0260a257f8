"""Routers' routes stand on the app itself, flat and in order, each as its router made it."""

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, HTTPException
from starlette.routing import BaseRoute

from gpu_share.coordinator.api.agent import node as agent_node
from gpu_share.coordinator.http.routes import add_routes


def _no_entry() -> None:
    raise HTTPException(401, "no entry")


tabs = APIRouter(prefix="/provider", tags=["tabs"])
machines = APIRouter(prefix="/provider", dependencies=[Depends(_no_entry)])


@tabs.get("/earnings")
async def earnings() -> str:
    return "earnings"


@machines.get("/{tab}")
async def machines_tab(tab: str) -> str:
    return f"machines {tab}"


def _app() -> FastAPI:
    app = FastAPI()
    add_routes(app, [tabs, machines])
    return app


def _paths(routes: list[BaseRoute]) -> list[str]:
    return [getattr(route, "path", "") for route in routes]


async def test_the_first_route_to_match_answers_with_its_router_s_prefix_and_dependencies() -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=_app()), base_url="http://t"
    ) as client:
        earned = await client.get("/provider/earnings")
        other = await client.get("/provider/gpus")
        missing = await client.get("/elsewhere")
    assert earned.json() == "earnings"  # not /provider/{tab}, which comes after it
    assert (other.status_code, other.json()) == (401, {"detail": "no entry"})
    assert missing.status_code == 404


def test_the_routes_stand_on_the_app_itself_in_order() -> None:
    app = _app()
    assert _paths(app.router.routes)[-2:] == ["/provider/earnings", "/provider/{tab}"]
    assert app.openapi()["paths"]["/provider/earnings"]["get"]["tags"] == ["tabs"]


def test_the_coordinator_s_first_routes_are_the_agents_own(app: FastAPI) -> None:
    """The agents' hot paths are matched first (after FastAPI's own document), each
    route directly on the app."""
    start = app.router.routes.index(agent_node.router.routes[0])
    assert _paths(app.router.routes[:start]) == ["/openapi.json"]
    assert app.router.routes[start:][: len(agent_node.router.routes)] == agent_node.router.routes
    assert _paths(app.router.routes).count("/v1/gpu/invoke") == 1


def test_a_router_with_handlers_of_its_own_is_refused() -> None:
    """They would never run: the routes alone join the app."""
    with_events = APIRouter(on_startup=[lambda: None])
    with pytest.raises(ValueError, match="startup or shutdown"):
        add_routes(FastAPI(), [with_events])
