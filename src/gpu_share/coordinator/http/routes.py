"""Puts routers' routes on the app itself, one flat list in the order given.

FastAPI's `include_router` keeps each included router as one nested entry, and a request
walks the entries one by one, each walking its own routes with bookkeeping of its own. With
the API's and the pages' 69 routers, matching was most of what a 404 cost (~2.4 of
~2.7 ms of CPU in process) and a share of every request to a later router. A router's
routes are whole already (its prefix, tags, dependencies and `include_in_schema` are in
each route), so they stand on the app as they are, and the app matches them directly.

What `include_router` would have carried and these routes do not: a router's startup and
shutdown handlers (ours have none: the app's lifespan holds them all; one given is
refused here), and `app.dependency_overrides`, which a route takes from the router
that made it (nothing here overrides a dependency: a test builds its app with what it
needs instead). The route objects are the routers' own, shared by every app a process
makes; they hold no app's state.
"""

from collections.abc import Iterable

from fastapi import APIRouter, FastAPI


def add_routes(app: FastAPI, routers: Iterable[APIRouter]) -> None:
    for router in routers:
        if router.on_startup or router.on_shutdown:
            raise ValueError(
                "a router's startup or shutdown handlers: put them in the app's lifespan"
            )
        app.router.routes.extend(router.routes)
