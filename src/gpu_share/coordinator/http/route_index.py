"""The app's routes indexed by the first two segments of their paths, so a request is
matched against the routes that could match it, not all of them.

A router matches a request by trying its routes in order, and the first full match
answers. The coordinator has ~250 routes at ~1 µs a try, and a path that matches none
(any anonymous client can send one) is tried against all of them twice, the second time
with its trailing slash toggled (`redirect_slashes`): ~0.5 ms of CPU in process before
its 404. Each page paid for the API's routes before it (~0.3 ms).

A route's path is fixed up to its first parameter, so a path can match it only if it
starts with that fixed part. Each route is keyed by the first two segments of its fixed
part, where they are whole (`/v1/invokes/{id}` by `v1`, `invokes`; `/v1/{name}` by `v1`
and any second segment; `/docs` by `docs` and no second segment), and a request's
candidates are the routes whose key admits its path's segments, or those of the path
with its trailing slash toggled (what `redirect_slashes` tries next), in the app's order.
The router then does what it always does, on that list: the same first match, the same
405 from a route that matched the path but not the method, the same redirect, the same
404. The lists are built on first use per pair of keys, and a segment that no route
names shares one list, so what a client can make this hold is bounded by the routes.

Routes added to the app after its first request re-index it (their count is checked on
every request).
"""

from typing import Final

from fastapi import APIRouter, FastAPI
from starlette._utils import get_route_path
from starlette.routing import BaseRoute, Mount
from starlette.types import Receive, Scope, Send

_ANY: Final = "\x00any"  # a route's segment that a parameter makes: any request's
_NONE: Final = "\x00none"  # a path without a second segment (`/docs`)
_OTHER: Final = "\x00other"  # a request's segment that no route names

_Key = tuple[str, str]


def _route_key(route: BaseRoute) -> _Key:
    """The first two whole segments of the route's fixed part (module doc)."""
    path = getattr(route, "path", None)
    if not isinstance(path, str) or not path.startswith("/"):
        return _ANY, _ANY
    if isinstance(route, Mount):
        fixed, exact = path + "/", False  # a mount takes every path below it
    else:
        fixed, _, _ = path.partition("{")
        exact = fixed == path
    segments = fixed[1:].split("/")

    def whole(i: int) -> bool:  # not cut short by a parameter
        return i < len(segments) - 1 or exact

    if not whole(0):
        return _ANY, _ANY
    if len(segments) > 1 and whole(1):
        return segments[0], segments[1]
    if exact and len(segments) == 1:
        return segments[0], _NONE
    return segments[0], _ANY


def _path_key(path: str) -> _Key:
    first, slash, rest = path[1:].partition("/")
    return first, rest.partition("/")[0] if slash else _NONE


def _admits(route: _Key, request: _Key) -> bool:
    return all(mine in (_ANY, theirs) for mine, theirs in zip(route, request, strict=True))


class RouteIndex:
    """Stands in front of `app.router` (as its middleware stack) and hands each request to
    a router holding only its candidate routes."""

    def __init__(self, router: APIRouter) -> None:
        if router.middleware_stack != router.app or router._low_priority_routes:
            raise ValueError("the router has middleware or low-priority routes: index it first")
        self._router = router
        self._indexed = -1
        self._routes: list[tuple[BaseRoute, _Key]] = []
        self._firsts: frozenset[str] = frozenset()
        self._seconds: frozenset[str] = frozenset()
        self._routers: dict[tuple[_Key, _Key], APIRouter] = {}

    def _index(self) -> None:
        self._routes = [(route, _route_key(route)) for route in self._router.routes]
        self._firsts = frozenset(key[0] for _, key in self._routes)
        self._seconds = frozenset(key[1] for _, key in self._routes)
        self._routers = {}
        self._indexed = len(self._router.routes)

    def _known(self, key: _Key) -> _Key:
        first, second = key
        if first not in self._firsts:
            return _OTHER, _OTHER  # only routes open from their first segment admit it
        return first, second if second in self._seconds else _OTHER

    @property
    def held(self) -> int:
        """How many candidate lists it holds (one per pair of keys asked for)."""
        return len(self._routers)

    def router_for(self, path: str) -> APIRouter:
        """A router holding the routes `path`, or its slash-toggled twin, could match."""
        if self._indexed != len(self._router.routes):
            self._index()
        own = self._known(_path_key(path))
        twin_path = path[:-1] if path.endswith("/") else path + "/"
        twin = self._known(_path_key(twin_path)) if path != "/" else own
        keys = (own, twin)
        router = self._routers.get(keys)
        if router is None:
            router = self._routers[keys] = self._subset(
                [route for route, key in self._routes if _admits(key, own) or _admits(key, twin)]
            )
        return router

    def _subset(self, routes: list[BaseRoute]) -> APIRouter:
        main = self._router
        subset = APIRouter(
            routes=routes, redirect_slashes=main.redirect_slashes, default=main.default
        )
        subset.form_limits = main.form_limits
        return subset

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._router.app(scope, receive, send)
            return
        scope.setdefault("router", self._router)  # `url_for` knows every route
        await self.router_for(get_route_path(scope)).app(scope, receive, send)


def index_routes(app: FastAPI) -> None:
    """Match the app's requests through a `RouteIndex`. Call it once the app's routes are
    in place; the router must have no middleware of its own."""
    app.router.middleware_stack = RouteIndex(app.router)
