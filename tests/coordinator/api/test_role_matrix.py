"""SPEC §1.1 for every route the app has, found by walking the app (`operations.py`), so a
route added later is held here without a line: no key, a malformed, an unknown or a
revoked key → 401; a key of another role (tenant, provider, agent node, admin) → 403;
both in the error shape of §1.8, and before the body is looked at. Pages: a stranger is
sent to /signin, a browser signed in with another role gets 403. The key of the role
that may call a route gets past the door (a matrix whose keys were all refused would
prove nothing). No answer is a 5xx (§1.8).

Only the admin key cannot be revoked here: there is one, and it may not revoke itself.
"""

import secrets
from collections.abc import Mapping

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.settings import Settings
from gpu_share.protocol.accounts import Role
from gpu_share.testing.factories import ADMIN, bearer
from tests.coordinator.api.keyholders import (
    MALFORMED,
    NO_KEY,
    Keyholders,
    browser,
    keyholders,
    register_node,
    revoke,
    unknown_key,
)
from tests.coordinator.api.operations import (
    ENROLLMENT,
    SCRIPT_ROUTES,
    Operation,
    Tally,
    api_operations,
    error_shaped,
    page_operations,
    roles_of,
    websocket_paths,
)

POLICY_VIOLATION = 1008


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The matrix sends hundreds of unknown keys from one address, on purpose."""
    settings.rate_limit_failed_keys = 1_000_000
    return settings


async def operations_of(app: FastAPI, client: httpx.AsyncClient) -> list[Operation]:
    document = await client.get("/openapi.json")
    assert document.status_code == 200
    return api_operations(app, document.json())


def past_the_door(response: httpx.Response) -> bool:
    """The caller was let in: whatever the route then says, it is no refusal of the key
    (and no 5xx but the documented 503 NO_CAPACITY)."""
    status = response.status_code
    return status not in (401, 403) and (status < 500 or error_code(response) == "NO_CAPACITY")


def _body_refused(response: httpx.Response) -> bool:
    """A 422 naming a field of the body: the matrix's minimal body was not valid."""
    if response.status_code != 422 or error_code(response) != "VALIDATION_ERROR":
        return False
    details = response.json()["error"].get("details") or []
    return any(isinstance(d, dict) and d.get("loc", [None])[0] == "body" for d in details)


def error_code(response: httpx.Response) -> str | None:
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


async def call(
    client: httpx.AsyncClient, operation: Operation, headers: Mapping[str, str], *, body: bool
) -> httpx.Response:
    """`body`: the minimal valid request; else the bare path (no body, no query): a refusal
    must come before anything is validated."""
    if not body:
        return await client.request(operation.method, operation.url(), headers=dict(headers))
    return await client.request(**operation.request(), headers={**operation.headers, **headers})


async def test_every_operation_refuses_missing_malformed_unknown_and_other_roles_keys(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    holders = await keyholders(client)
    tally = Tally("role matrix (API)")
    operations = await operations_of(app, client)
    for operation in operations:
        roles = roles_of(operation)
        name = operation.name
        if roles is None:
            answer = await _public(app, client, operation, holders)
            tally.check(past_the_door(answer), f"{name}: public, with no key", answer)
            continue
        for label, headers, body in (
            ("no key", NO_KEY, False),
            ("no key, full request", NO_KEY, True),
            ("malformed", MALFORMED, True),
            ("unknown key", unknown_key(), True),
        ):
            answer = await call(client, operation, headers, body=body)
            tally.check(error_shaped(answer, 401), f"{name}: {label} → 401", answer)
        await _roles(client, operation, roles, holders, tally)
    tally.verdict(at_least=8 * len(operations) // 2)


async def _public(
    app: FastAPI, client: httpx.AsyncClient, operation: Operation, holders: Keyholders
) -> httpx.Response:
    """A public route called with no key; a form a stranger posts carries the stranger's
    CSRF token (and a key, which only the sign-in form reads), from a browser of its own."""
    if not (operation.hidden and operation.method == "POST"):
        return await call(client, operation, NO_KEY, body=True)
    async with browser(app) as stranger:
        form = {"csrf": stranger.csrf, "key": holders.keys[Role.TENANT]}
        return await stranger.http.post(operation.url(), data=form)


async def _roles(
    client: httpx.AsyncClient,
    operation: Operation,
    roles: frozenset[Role],
    holders: Keyholders,
    tally: Tally,
) -> None:
    name = operation.name
    enrollment = bearer(holders.enrollment_token)
    if operation.name in ENROLLMENT:  # a key of any role is no enrollment token
        for role, key in holders.keys.items():
            answer = await call(client, operation, bearer(key), body=True)
            tally.check(error_shaped(answer, 401), f"{name}: {role} key → 401", answer)
        answer = await call(client, operation, enrollment, body=True)
        tally.check(past_the_door(answer), f"{name}: the enrollment token gets in", answer)
        return
    answer = await call(client, operation, enrollment, body=True)
    tally.check(error_shaped(answer, 401), f"{name}: an enrollment token → 401", answer)
    for role, key in holders.keys.items():
        answer = await call(client, operation, bearer(key), body=True)
        if role in roles:
            tally.check(
                past_the_door(answer) and not _body_refused(answer),
                f"{name}: its own role {role} gets in with a valid body",
                answer,
            )
        else:
            tally.check(error_shaped(answer, 403), f"{name}: {role} key → 403", answer)


async def test_a_revoked_key_is_refused_on_every_operation_of_its_role(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    holders = await keyholders(client)
    revoked = {
        Role.TENANT: (
            await client.post(f"/v1/admin/tenants/{await _tenant_id(client)}/keys", headers=ADMIN)
        ).json()["api_key"],
        Role.AGENT: (await register_node(client, holders.enrollment_token, "revoked-node"))[
            "node_key"
        ],
        Role.PROVIDER: (
            await client.post(
                "/v1/admin/providers",
                json={"name": "Revoked Farm", "email": "revoked@example.com"},
                headers=ADMIN,
            )
        ).json()["api_key"],
    }
    tally = Tally("revoked keys")
    async with (
        browser(app, revoked[Role.TENANT]) as tenant_page,
        browser(app, revoked[Role.PROVIDER]) as provider_page,
    ):
        for key in revoked.values():
            await revoke(client, key)
        for operation in await operations_of(app, client):
            if operation.name in ENROLLMENT:  # its credential is no key
                continue
            for role in (roles_of(operation) or set()) & revoked.keys():
                answer = await call(client, operation, bearer(revoked[role]), body=True)
                tally.check(
                    error_shaped(answer, 401) and "revoked" in answer.text,
                    f"{operation.name}: revoked {role} key → 401",
                    answer,
                )
        pages = {Role.TENANT: tenant_page, Role.PROVIDER: provider_page}
        for operation in page_operations(app):
            roles = roles_of(operation) or frozenset()
            for role in roles & pages.keys():
                signed = pages[role]
                answer = await _page(signed.http, operation, signed.csrf)
                tally.check(
                    _sent_to_signin(operation, answer),
                    f"{operation.name}: the session of a revoked key",
                    answer,
                )
    tally.verdict(at_least=100)


async def _tenant_id(client: httpx.AsyncClient) -> str:
    made = await client.post(
        "/v1/admin/tenants", json={"name": "Revoked Co", "email": "gone@example.com"}, headers=ADMIN
    )
    assert made.status_code == 201, made.text
    tenant_id: str = made.json()["id"]
    return tenant_id


async def _page(http: httpx.AsyncClient, operation: Operation, csrf: str | None) -> httpx.Response:
    """A page as its browser calls it: a form posted with the page's CSRF token (in the
    form, and in the header the scripts' uploads carry it in)."""
    if operation.method == "POST" and csrf:
        return await http.post(operation.url(), data={"csrf": csrf}, headers={"X-CSRF-Token": csrf})
    return await http.request(operation.method, operation.url())


def _to_signin(response: httpx.Response) -> bool:
    return response.status_code == 303 and response.headers["location"].startswith("/signin")


def _sent_to_signin(operation: Operation, response: httpx.Response) -> bool:
    """A stranger is sent to sign in: a page redirects, a script's route answers 401."""
    if operation.name in SCRIPT_ROUTES:
        return error_shaped(response, 401)
    return _to_signin(response)


async def test_every_page_sends_strangers_to_signin_and_other_roles_away(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    holders = await keyholders(client)
    tally = Tally("role matrix (pages)")
    operations = page_operations(app)
    async with (
        browser(app) as stranger,
        browser(app, holders.keys[Role.TENANT]) as tenant_page,
        browser(app, holders.keys[Role.PROVIDER]) as provider_page,
        browser(app, holders.keys[Role.ADMIN]) as admin_page,
    ):
        signed = {Role.TENANT: tenant_page, Role.PROVIDER: provider_page, Role.ADMIN: admin_page}
        refused = await stranger.http.post(
            "/signin", data={"csrf": stranger.csrf, "key": holders.keys[Role.AGENT]}
        )
        tally.check(refused.status_code == 403, "POST /signin: an agent node key", refused)
        for operation in operations:
            roles = roles_of(operation)
            assert roles is not None
            answer = await _page(stranger.http, operation, None)
            tally.check(_sent_to_signin(operation, answer), f"{operation.name}: a stranger", answer)
            for role, page in signed.items():
                answer = await _page(page.http, operation, page.csrf)
                if role in roles:
                    tally.check(
                        answer.status_code != 403
                        and not _to_signin(answer)
                        and answer.status_code < 500,
                        f"{operation.name}: its own role {role} gets in",
                        answer,
                    )
                else:
                    tally.check(answer.status_code == 403, f"{operation.name}: {role}", answer)
    tally.verdict(at_least=4 * len(operations))


async def websocket_close_code(app: FastAPI, path: str, headers: Mapping[str, str]) -> int | None:
    """Open a WebSocket on the app as a client would: the close code it answers before
    accepting, or None when it accepts."""
    sent: list[dict[str, object]] = []
    incoming: list[dict[str, object]] = [{"type": "websocket.connect"}]

    async def receive() -> dict[str, object]:
        return incoming.pop(0) if incoming else {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "scheme": "ws",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
        "subprotocols": [],
        "state": {},
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    first = sent[0]
    if first["type"] == "websocket.accept":
        return None
    assert first["type"] == "websocket.close", first
    code = first.get("code", 1000)
    assert isinstance(code, int)
    return code


async def test_every_websocket_refuses_strangers_and_other_roles_before_accepting(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    holders = await keyholders(client)
    tally = Tally("role matrix (WebSockets)")
    paths = websocket_paths(app)
    for path in paths:
        callers = {
            "no key": NO_KEY,
            "unknown key": bearer("gpu_ak_" + secrets.token_urlsafe(32)),
            **{f"{role} key": bearer(k) for role, k in holders.keys.items() if role != Role.AGENT},
        }
        for label, headers in callers.items():
            code = await websocket_close_code(app, path, headers)
            tally.check(code == POLICY_VIOLATION, f"WS {path}: {label} → close {code}")
        code = await websocket_close_code(app, path, bearer(holders.keys[Role.AGENT]))
        tally.check(code is None, f"WS {path}: its agent node key is accepted, not {code}")
    tally.verdict(at_least=6 * len(paths))
