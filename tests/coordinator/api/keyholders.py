"""Callers of every role for the hostile matrices, made through the real API: a live key
of each role, an enrollment token, revoked keys, and browsers signed in through the real
sign-in form."""

import hashlib
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI

from gpu_share.protocol.accounts import Role
from gpu_share.testing.factories import (
    ADMIN,
    TEST_ADMIN_KEY,
    bearer,
    create_provider,
    create_tenant,
)
from gpu_share.testing.simulated_agent import inventory

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
NO_KEY: dict[str, str] = {}
MALFORMED = {"Authorization": "Bearer two words"}


def unknown_key() -> dict[str, str]:
    return bearer("gpu_sk_" + secrets.token_urlsafe(32))


@dataclass(frozen=True)
class Keyholders:
    keys: dict[Role, str]  # a live key of each role
    enrollment_token: str  # what an agent registers with: no API key
    node_id: str


async def register_node(client: httpx.AsyncClient, token: str, machine: str) -> dict[str, str]:
    """A node registered with `token` (its own machine): the registration's answer."""
    fingerprint = hashlib.sha256(machine.encode()).hexdigest()
    answer = await client.post(
        "/v1/agent/register",
        json={
            "inventory": inventory(hostname=machine, fingerprint=fingerprint).model_dump(
                mode="json"
            )
        },
        headers=bearer(token),
    )
    assert answer.status_code == 201, answer.text
    registered: dict[str, str] = answer.json()
    return registered


async def keyholders(client: httpx.AsyncClient, name: str = "Matrix") -> Keyholders:
    tenant = await create_tenant(client, f"{name} Tenant")
    provider = await create_provider(client, f"{name} Farm")
    node = await register_node(client, provider.enrollment_token, f"{name.lower()}-node")
    keys = {
        Role.TENANT: tenant.key,
        Role.PROVIDER: provider.key,
        Role.AGENT: node["node_key"],
        Role.ADMIN: TEST_ADMIN_KEY,
    }
    return Keyholders(keys, provider.enrollment_token, node["node_id"])


async def revoke(client: httpx.AsyncClient, key: str) -> None:
    """Revoke `key` as the admin does, found by its prefix in the admin's list."""
    listed = await client.get("/v1/admin/keys", headers=ADMIN)
    (found,) = [k["id"] for k in listed.json() if key.startswith(k["prefix"])]
    answer = await client.post(f"/v1/admin/keys/{found}/revoke", headers=ADMIN)
    assert answer.status_code == 200, answer.text


@dataclass
class SignedBrowser:
    """A browser signed in through the sign-in form: its cookies, and its CSRF token."""

    http: httpx.AsyncClient
    csrf: str


@asynccontextmanager
async def browser(app: FastAPI, key: str | None = None) -> AsyncIterator[SignedBrowser]:
    """A browser of its own (cookies apart), signed in with `key` unless None."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        form = await http.get("/signin")
        csrf = CSRF.search(form.text)
        assert csrf is not None
        if key is None:
            yield SignedBrowser(http, csrf[1])
            return
        signed = await http.post("/signin", data={"csrf": csrf[1], "key": key})
        assert signed.status_code == 303, signed.text
        home = await http.get(signed.headers["location"])
        token = CSRF.search(home.text)
        assert home.status_code == 200 and token is not None, home.text[:300]
        yield SignedBrowser(http, token[1])
