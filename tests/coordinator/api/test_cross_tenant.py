"""SPEC §1.1, "another tenant's object → 404 (never reveal existence)", for every route the
app has (`operations.py`), so a route added later is held here without a line.

A owns one of everything (`rivals.py`). Every operation whose path names an object A
owns is called by B of the operation's role (tenant B, provider B, agent node B; the
admin sees everything by design) with A's id: B gets exactly what it gets for an id
that names nothing (404 NOT_FOUND for tenants and providers; a node gets the answer it
gets for another node's work), nothing of A's in the answer, and nothing changes in the
database. Every list B can read (the API's and the pages') holds nothing of A's, while
A's own lists do show A's objects (so the strings looked for are the right ones).
"""

import hashlib
from collections.abc import Iterator, Mapping
from contextlib import AsyncExitStack

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.orm import Base
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.replica.state import Replica
from gpu_share.protocol.accounts import Role
from tests.coordinator.api.keyholders import SignedBrowser, browser
from tests.coordinator.api.operations import (
    ENROLLMENT,
    Operation,
    Tally,
    api_operations,
    error_shaped,
    page_operations,
    roles_of,
    sample,
)
from tests.coordinator.api.rivals import Side, side

# Operations that show B an object of A's by design, and why.
SHARED_BY_DESIGN = {
    "GET /v1/nodes/{node_id}/benchmarks": "a listed node's benchmarks are the marketplace's",
}
# Tables a refused request may still write, and why.
WRITTEN_WHEN_REFUSED: dict[str, str] = {}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Challenges shrunk to a few kilobytes, as in the challenge tests."""
    settings.challenge_scale = 1e-7
    settings.challenge_memory_share = 0.5
    return settings


class Callers:
    """B's callers (and A's, for the controls) by role: API keys and signed-in browsers."""

    def __init__(self, client: httpx.AsyncClient, pages: Mapping[tuple[str, Role], SignedBrowser]):
        self.client = client
        self.pages = pages

    async def call(
        self, who: Side, whose: str, operation: Operation, role: Role, ids: Mapping[str, str]
    ) -> httpx.Response:
        if not operation.page:
            request = operation.request(**ids)
            headers = {**operation.headers, **who.headers(role)}
            return await self.client.request(**request, headers=headers)
        signed = self.pages[(whose, role)]
        if operation.method == "POST":
            return await signed.http.post(
                operation.url(**ids),
                data={"csrf": signed.csrf},
                headers={"X-CSRF-Token": signed.csrf},
            )
        return await signed.http.request(operation.method, operation.url(**ids))


def caller_role(operation: Operation) -> Role | None:
    """Whose object a call with A's id tries to reach: None where no B is to be held
    (public routes, the admin's, the enrollment token's)."""
    roles = roles_of(operation)
    if roles is None or operation.name in ENROLLMENT or operation.name in SHARED_BY_DESIGN:
        return None
    others = roles - {Role.ADMIN}
    assert len(others) <= 1, f"{operation.name}: which of {others} is B?"
    return next(iter(others), None)


def shown(response: httpx.Response) -> str:
    """All a caller learns from an answer: its body, where it sends them, a flash."""
    return " ".join(
        [
            response.text,
            response.headers.get("location", ""),
            response.headers.get("set-cookie", ""),
        ]
    )


def normalized(response: httpx.Response, ids: Mapping[str, str]) -> tuple[int, str]:
    text_shown = shown(response)
    for param, value in ids.items():
        text_shown = text_shown.replace(value, f"{{{param}}}")
    return response.status_code, text_shown


def id_cases(operation: Operation, a: Side) -> Iterator[dict[str, str]]:
    """A's ids for the operation's path parameters, each of A's objects once."""
    objects = [p for p in operation.params if p not in NOT_OBJECTS]
    for param in objects:
        assert a.owned.get(param), (
            f"{operation.name}: A owns no {param}; make one in rivals.py, or name the "
            "parameter in NOT_OBJECTS if it names nothing anyone owns"
        )
        for value in a.owned[param]:
            yield {p: value if p == param else a.owned[p][0] for p in objects}


# Path parameters that name no object of anyone's.
NOT_OBJECTS = {
    "gpu_model": "a GPU model: each provider prices its own",
    "tab": "a tab of the provider's pages",
    "month": "a calendar month: each account's statement is its own",
}
# The kinds of A's objects that A's own lists show (a challenge is shown per node).
LISTED = [
    "invoke_id",
    "session_id",
    "artifact_id",
    "reservation_id",
    "key_id",
    "node_id",
    "token_id",
]


async def digest(replica: Replica) -> dict[str, str]:
    """Each table's rows, hashed: what a refused request must leave as it was."""
    found: dict[str, str] = {}
    async with replica.db.read() as session:
        for table in Base.metadata.sorted_tables:
            rows = (await session.execute(select(table))).all()
            found[table.name] = hashlib.sha256(repr(sorted(map(repr, rows))).encode()).hexdigest()
    return found


async def test_no_tenant_provider_or_node_reaches_anothers_objects(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    a = await side(app, client, "A", rich=True)
    b = await side(app, client, "B", rich=False)
    document = (await client.get("/openapi.json")).json()
    operations = api_operations(app, document) + page_operations(app)
    tally = Tally("cross-tenant")
    async with AsyncExitStack() as stack:
        pages = {
            (name, role): await stack.enter_async_context(browser(app, who.key(role)))
            for name, who in (("A", a), ("B", b))
            for role in (Role.TENANT, Role.PROVIDER)
        }
        callers = Callers(client, pages)
        before = await digest(app.state.replica)
        for operation in operations:
            role = caller_role(operation)
            if role is not None:
                await _objects(callers, operation, role, a, b, tally)
        after = await digest(app.state.replica)
        changed = {t for t in before if before[t] != after[t]} - WRITTEN_WHEN_REFUSED.keys()
        tally.check(not changed, f"B's refused calls changed the tables {sorted(changed)}")
        listed: set[str] = set()
        for operation in operations:
            role = caller_role(operation)
            if role is not None and not operation.params and operation.method == "GET":
                listed |= await _lists(callers, operation, role, a, b, tally)
    unlisted = {i for kind in LISTED for i in a.owned[kind]} - listed
    tally.check(not unlisted, f"A's own lists do not show A's {sorted(unlisted)}")
    tally.verdict(at_least=200)


async def _objects(
    callers: Callers, operation: Operation, role: Role, a: Side, b: Side, tally: Tally
) -> None:
    own_reads: list[int] = []
    for ids in id_cases(operation, a):
        nothing = {param: sample(param, operation.path) for param in ids}
        theirs = await callers.call(b, "B", operation, role, ids)
        absent = await callers.call(b, "B", operation, role, nothing)
        case = f"{operation.name} as {role} B on A's {ids}"
        if not operation.page and role is not Role.AGENT:
            tally.check(error_shaped(theirs, 404), f"{case} → 404 NOT_FOUND", theirs)
        else:
            tally.check(theirs.status_code in (303, 404, 409), f"{case} → refused", theirs)
        tally.check(
            normalized(theirs, ids) == normalized(absent, nothing),
            f"{case}: unlike for no object ({absent.status_code} {absent.text[:80]!r})",
            theirs,
        )
        leaked = {s for s in a.secrets.get(role, set()) if s in shown(theirs)} - set(ids.values())
        tally.check(not leaked, f"{case}: shows A's {sorted(leaked)}", theirs)
        if operation.method == "GET" and role is not Role.AGENT:
            own_reads.append((await callers.call(a, "A", operation, role, ids)).status_code)
    if own_reads:  # one of A's objects at least (a running invoke has no outputs yet)
        tally.check(200 in own_reads, f"{operation.name}: A reads its own ({own_reads})")


async def _lists(
    callers: Callers, operation: Operation, role: Role, a: Side, b: Side, tally: Tally
) -> set[str]:
    """B's answer shows nothing of A's; returns what A's own answer shows of A's."""
    answer = await callers.call(b, "B", operation, role, {})
    leaked = {s for s in a.secrets.get(role, set()) if s in shown(answer)}
    tally.check(not leaked, f"{operation.name} as {role} B lists A's {sorted(leaked)}", answer)
    own = shown(await callers.call(a, "A", operation, role, {}))
    return {s for s in a.secrets.get(role, set()) if s in own}
