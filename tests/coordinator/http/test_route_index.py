"""A request is matched against the routes its path could match, and the answer is the one
the router would give walking all of them."""

import re
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.routing import BaseRoute, Match, Mount

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.http.route_index import RouteIndex, index_routes

METHODS = ("GET", "POST", "PUT", "DELETE")


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    """The coordinator's app as served (its routes only: no lifespan, no database)."""
    data: Path = tmp_path_factory.mktemp("route-index")
    return create_app(Settings(database_url=f"sqlite+aiosqlite:///{data}/db", data_dir=data))


def _outcome(routes: list[BaseRoute], path: str, method: str) -> tuple[str, int]:
    """What the router does with the request, as (what, which route): the first full match,
    else the first partial one (a 405), else the slash-toggled path's first match (a
    redirect), else nothing (a 404)."""
    scope = {"type": "http", "path": path, "root_path": "", "method": method, "headers": []}
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return "full", id(route)
        if match == Match.PARTIAL and partial is None:
            partial = id(route)
    if partial is not None:
        return "partial", partial
    if path != "/":
        twin = {**scope, "path": path[:-1] if path.endswith("/") else path + "/"}
        for route in routes:
            if route.matches(twin)[0] != Match.NONE:
                return "redirect", id(route)
    return "none", 0


def _index(app: FastAPI) -> RouteIndex:
    index = app.router.middleware_stack
    assert isinstance(index, RouteIndex)
    return index


def _filled(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "x1", path)


def _route_paths(app: FastAPI) -> list[str]:
    paths = []
    for route in app.router.routes:
        path = _filled(getattr(route, "path", "/"))
        paths.append(path + "/a/b" if isinstance(route, Mount) else path)
    return paths


def test_every_route_s_own_path_is_answered_as_the_full_walk_answers_it(
    coordinator: FastAPI,
) -> None:
    index, routes = _index(coordinator), coordinator.router.routes
    paths = _route_paths(coordinator)
    variants = {
        variant
        for path in paths
        for variant in (path, path + "/", path.rstrip("/") or "/", path + "/more", path[:-1])
    }
    assert len(variants) > 500
    for path in sorted(variants):
        for method in METHODS:
            assert _outcome(index.router_for(path).routes, path, method) == _outcome(
                routes, path, method
            ), (method, path)


_segment = st.sampled_from(
    [
        *("v1", "agent", "gpu", "invoke", "invokes", "provider", "admin", "static", "docs"),
        *("x1", "", "lease", "nodes", "console", "openapi.json", "zz", "\x00any", "\x00none"),
    ]
)


@settings(max_examples=400, deadline=None)
@given(segments=st.lists(_segment, max_size=5), method=st.sampled_from(METHODS))
def test_any_path_is_answered_as_the_full_walk_answers_it(
    coordinator: FastAPI, segments: list[str], method: str
) -> None:
    path = "/" + "/".join(segments)
    routes = _index(coordinator).router_for(path).routes
    assert _outcome(routes, path, method) == _outcome(coordinator.router.routes, path, method)


def test_a_path_is_matched_against_a_few_routes_and_a_stranger_s_against_none(
    coordinator: FastAPI,
) -> None:
    index = _index(coordinator)
    total = len(coordinator.router.routes)
    assert total > 200
    agent = index.router_for("/v1/agent/lease").routes
    assert 0 < len(agent) < 30
    strangers = index.router_for("/wp-admin/setup.php").routes
    assert all(getattr(route, "path", "").startswith("/{") for route in strangers)


def test_what_strangers_paths_make_the_index_hold_is_bounded_by_the_routes(
    coordinator: FastAPI,
) -> None:
    index = _index(coordinator)
    for i in range(2_000):
        index.router_for(f"/probe{i}/v1/{i}")
        index.router_for(f"/v1/probe{i}")
    assert index.held < 200


async def test_answers_through_the_index_404_405_redirect_and_a_route_added_later() -> None:
    app = FastAPI()

    @app.get("/v1/things/{name}")
    async def thing(name: str) -> str:
        return name

    @app.get("/v1/folder/")
    async def folder() -> str:
        return "folder"

    index_routes(app)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        assert (await client.get("/v1/things/a")).json() == "a"
        assert (await client.post("/v1/things/a")).headers["allow"] == "GET"
        moved = await client.get("/v1/folder")
        assert (moved.status_code, moved.headers["location"]) == (307, "http://t/v1/folder/")
        assert (await client.get("/v1/nothing")).status_code == 404

        @app.get("/v1/later")
        async def later() -> str:
            return "later"

        assert (await client.get("/v1/later")).json() == "later"


def test_a_router_with_middleware_of_its_own_is_refused() -> None:
    app = FastAPI()
    index_routes(app)
    with pytest.raises(ValueError, match="middleware"):
        index_routes(app)  # its stack is the index now
