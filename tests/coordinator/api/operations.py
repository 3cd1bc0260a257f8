"""Every route of the app as the hostile matrices call it (`test_role_matrix`,
`test_cross_tenant`, `test_csrf`, `test_fuzz`): who may call it, a well-formed value for
each path parameter, and a minimal valid request.

Routes are enumerated from the app itself (its OpenAPI document, then `app.routes` for
what the document hides), so a route added later joins every matrix without a line here.
Who may call a route follows from its path (`/v1/admin` admins, `/v1/agent` agent
nodes, `/v1/provider` providers, the rest of `/v1` tenants; the pages `/admin`,
`/provider`, `/console` likewise); only a route that is public, or serves several roles,
by design is named below, so making a route public is a deliberate act.
"""

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute, APIWebSocketRoute, iter_route_contexts
from starlette.routing import Route

from gpu_share import __version__
from gpu_share.coordinator.core.ids import new_id
from gpu_share.protocol.accounts import Role

PAGE_ROLES = {"/console": Role.TENANT, "/provider": Role.PROVIDER, "/admin": Role.ADMIN}
API_ROLES = {
    "/metrics": Role.ADMIN,  # or the operator's metrics token (test_metrics.py)
    "/v1/admin/": Role.ADMIN,
    "/v1/agent/": Role.AGENT,
    "/v1/provider/": Role.PROVIDER,
    "/v1/": Role.TENANT,
}

# Public by design: callable with no key at all. Each line says why.
PUBLIC: dict[str, str] = {
    "GET /health": "the load balancer's probe (SPEC §1.2)",
    "GET /openapi.json": "the API's description (SPEC §1)",
    "GET /openapi.yaml": "the API's description (SPEC §1)",
    "GET /docs": "Swagger UI (SPEC §1)",
    "POST /v1/tenant/applications": "tenants apply before they have a key (SPEC §1.1)",
    "POST /v1/tenant/applications/confirm/{token}": "the mailed confirmation link",
    "GET /v1/provider/gpu-models": "the application form's list of GPU models (SPEC §3.1)",
    "POST /v1/provider/applications": "providers apply before they have a key (SPEC §3.1)",
    "POST /v1/provider/applications/confirm/{token}": "the mailed confirmation link",
    "GET /v1/provider/applications/status/{token}": "the applicant's status link",
    "PUT /v1/provider/applications/status/{token}": "the applicant amends through the link",
    "POST /v1/provider/claim/{token}": "an approved applicant claims the key once",
    "GET /agent/install.sh": "the agent's installer (SPEC §3.2)",
    f"GET /agent/gpu_share-{__version__}-py3-none-any.whl": "the wheel the installer fetches",
    "GET /": "the landing page",
    "GET /signin": "the sign-in form",
    "POST /signin": "signing in (its key is the credential)",
    "POST /signout": "signing out ends whatever session the browser holds",
    "GET /apply": "the application form",
    "POST /apply": "applying",
    "GET /apply/sent": "the page after applying",
    "GET /apply/status/{token}": "the applicant's status link",
    "POST /apply/status/{token}": "the applicant amends through the link",
    "GET /provider/claim/{token}": "the claim link's page",
    "POST /provider/claim/{token}": "claiming the key once",
    "GET /apply/confirm/{token}": "the mailed confirmation link",
    "POST /apply/confirm/{token}": "confirming the email",
    "GET /apply/tenant/confirm/{token}": "the mailed confirmation link",
    "POST /apply/tenant/confirm/{token}": "confirming the email",
}
# Routes under the pages that their scripts call: a stranger gets the API's 401 (a
# redirect to /signin would only confuse the script), see web/tenant/console.py.
SCRIPT_ROUTES = {"GET /console/invokes/{invoke_id}/log", "POST /console/artifacts/upload"}
# Authenticated by a credential that is not an API key: the enrollment token.
ENROLLMENT = {"POST /v1/agent/register"}
# Served to several roles by design: the marketplace is the admin's view too.
SEVERAL_ROLES: dict[str, frozenset[Role]] = {
    "GET /v1/nodes": frozenset({Role.TENANT, Role.ADMIN}),
    "GET /v1/gpu/runtimes": frozenset({Role.TENANT, Role.ADMIN}),
    "GET /v1/nodes/{node_id}/benchmarks": frozenset({Role.TENANT, Role.ADMIN}),
    "GET /v1/offers": frozenset({Role.TENANT, Role.ADMIN}),
}

# Path parameters without a pattern in the OpenAPI document (pages have none): a value
# each (an id prefix, or a value), chosen by name; `application_id` by its path.
PARAM_PREFIXES = {
    "invoke_id": "inv",
    "session_id": "ses",
    "artifact_id": "art",
    "key_id": "key",
    "node_id": "nod",
    "tenant_id": "ten",
    "provider_id": "prv",
    "token_id": "enr",
    "batch_id": "pbat",
    "payout_id": "pay",
    "reservation_id": "rsv",
    "challenge_id": "chl",
    "incident_id": "inc",
    "endpoint_id": "whe",
    "delivery_id": "msg",
}
PARAM_VALUES = {
    "token": "gpu_st_" + "0" * 43,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "fmt": "csv",
    "action": "paid",
    "tab": "no-such-tab",
    "month": "2026-11",
}
ID_PATTERN = re.compile(r"\^(\w+)_\[[^]]+\]\{26\}\$")

# Bodies the schema alone cannot make valid (a checked address, a long-poll's wait).
BODIES: dict[str, dict[str, Any]] = {
    "POST /v1/agent/lease": {"slots": 1, "free_gpus": 0, "wait_sec": 0},
    "PUT /v1/provider/payout-settings": {
        "method": {"kind": "solana_usdc", "address": "So11111111111111111111111111111111111111112"},
        "schedule": "monthly",
    },
    "POST /v1/gpu/invoke": {"runtime": "onnx_cpu", "model_url": "https://example.com/m.onnx"},
    "POST /v1/agent/invokes/{invoke_id}/result": {
        "lease_token": "0" * 32,
        "status": "failed",
        "error": {"code": "INVALID_MODEL", "message": "the matrix's"},
    },
    "POST /v1/agent/challenges/{challenge_id}/commit": {"sketches": "AAAAAA=="},
    "POST /v1/webhooks/endpoints": {
        "url": "https://example.com/hook",
        "event_types": ["topup.credited"],
    },
    "POST /v1/provider/webhooks/endpoints": {
        "url": "https://example.com/hook",
        "event_types": ["payout.paid"],
    },
}
RAW_BODY = b"\x00matrix\x00"


@dataclass(frozen=True)
class Operation:
    """One method of one route, and what a minimal valid request to it carries."""

    method: str
    path: str
    params: tuple[str, ...]
    samples: Mapping[str, str]  # a well-formed value for each path parameter
    query: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    page: bool = False  # under a signed-in prefix (/console, /provider, /admin)
    hidden: bool = False  # not in the OpenAPI document: a page, or a form it posts

    @property
    def name(self) -> str:
        return f"{self.method} {self.path}"

    def url(self, **values: str) -> str:
        """The path with `values` for its parameters, the samples for the rest."""
        filled = {**self.samples, **values}
        return self.path.format_map(filled)

    def request(self, **values: str) -> dict[str, Any]:
        """`httpx` keyword arguments for a minimal valid request (headers apart)."""
        args: dict[str, Any] = {"method": self.method, "url": self.url(**values)}
        if self.query:
            args["params"] = dict(self.query)
        if self.json is not None:
            args["json"] = self.json
        elif self.content is not None:
            args["content"] = self.content
        return args


def roles_of(operation: Operation) -> frozenset[Role] | None:
    """Who may call it: None when anyone may (`PUBLIC`)."""
    if operation.name in PUBLIC:
        return None
    if operation.name in SEVERAL_ROLES:
        return SEVERAL_ROLES[operation.name]
    owners = PAGE_ROLES if operation.page else API_ROLES
    for prefix, role in owners.items():
        if operation.path == prefix or operation.path.startswith(prefix.rstrip("/") + "/"):
            return frozenset({role})
    raise AssertionError(
        f"{operation.name} belongs to no role: give it a path of its role's prefix, or "
        "name it in PUBLIC with the reason it is public"
    )


def is_page(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PAGE_ROLES)


def _routes(app: FastAPI) -> Iterator[tuple[str, str, Route]]:
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, Route) and context.path is not None:
            for method in sorted((context.methods or set()) - {"HEAD"}):
                yield method, context.path, route


def api_operations(app: FastAPI, document: Mapping[str, Any]) -> list[Operation]:
    """Every operation of the OpenAPI `document`, then every route it hides that is no page."""
    found: dict[str, Operation] = {}
    for path, methods in document["paths"].items():
        for method, spec in methods.items():
            operation = _from_document(method.upper(), path, spec, document)
            found[operation.name] = operation
    for method, path, route in _routes(app):
        name = f"{method} {path}"
        if name in found or (is_page(path) and name not in PUBLIC):
            continue
        assert not (isinstance(route, APIRoute) and route.include_in_schema), name
        found[name] = _plain(method, path, page=False)
    assert found, "the app has no routes"
    return sorted(found.values(), key=lambda o: o.name)


def page_operations(app: FastAPI) -> list[Operation]:
    """Every route under the signed-in pages' prefixes that is not public."""
    return [
        _plain(method, path, page=True)
        for method, path, _ in _routes(app)
        if is_page(path) and f"{method} {path}" not in PUBLIC
    ]


def websocket_paths(app: FastAPI) -> list[str]:
    return [
        context.path
        for context in iter_route_contexts(app.routes)
        if isinstance(context.original_route, APIWebSocketRoute) and context.path
    ]


def _params(path: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\{(\w+)\}", path))


def sample(name: str, path: str, schema: Mapping[str, Any] | None = None) -> str:
    """A well-formed value for the path parameter `name` that names nothing."""
    if schema and (found := ID_PATTERN.fullmatch(schema.get("pattern", ""))):
        return new_id(found[1])
    if name == "application_id":
        return new_id("tapp" if "tenant-applications" in path else "papp")
    if name in PARAM_PREFIXES:
        return new_id(PARAM_PREFIXES[name])
    assert name in PARAM_VALUES, f"{path}: add a sample value for the path parameter {name!r}"
    return PARAM_VALUES[name]


def _plain(method: str, path: str, *, page: bool) -> Operation:
    params = _params(path)
    samples = {p: sample(p, path) for p in params}
    return Operation(method, path, params, samples, page=page, hidden=True)


def _from_document(
    method: str, path: str, spec: Mapping[str, Any], document: Mapping[str, Any]
) -> Operation:
    name = f"{method} {path}"
    samples: dict[str, str] = {}
    query: dict[str, Any] = {}
    headers: dict[str, str] = {}
    for parameter in spec.get("parameters", []):
        schema = _resolve(parameter.get("schema", {}), document)
        if parameter["in"] == "path":
            samples[parameter["name"]] = sample(parameter["name"], path, schema)
        elif parameter.get("required"):
            value = minimal(schema, document, parameter["name"])
            (query if parameter["in"] == "query" else headers)[parameter["name"]] = value
    json_body: Any = None
    content: bytes | None = None
    if body := spec.get("requestBody"):
        media = body.get("content", {})
        if "application/json" in media:
            schema = media["application/json"].get("schema", {})
            json_body = BODIES.get(name) or minimal(_resolve(schema, document), document, "")
        else:
            content = RAW_BODY
    return Operation(
        method,
        path,
        _params(path),
        samples,
        query,
        {k: str(v) for k, v in headers.items()},
        json_body,
        content,
    )


def _resolve(schema: Mapping[str, Any], document: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def minimal(schema: Mapping[str, Any], document: Mapping[str, Any], name: str) -> Any:
    """The smallest instance of `schema` a validator accepts: required fields only, the
    first of enums and alternatives, the least number, a string its pattern matches."""
    schema = _resolve(schema, document)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for alternatives in ("oneOf", "anyOf"):
        if alternatives in schema:
            options = [_resolve(s, document) for s in schema[alternatives]]
            chosen = next(s for s in options if s.get("type") != "null")
            return minimal(chosen, document, name)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        return {key: minimal(properties[key], document, key) for key in schema.get("required", [])}
    if kind == "array":
        return [minimal(schema["items"], document, name)] * schema.get("minItems", 0)
    if kind == "integer":
        return int(schema.get("minimum", schema.get("exclusiveMinimum", 0) + 1))
    if kind == "number":
        return schema.get("minimum", 1.0)
    if kind == "boolean":
        return False
    return _string(schema, name)


def _string(schema: Mapping[str, Any], name: str) -> str:
    if schema.get("format") == "date-time":
        return "2026-01-01T00:00:00Z"
    if schema.get("format") == "email" or "email" in name:
        return "someone@example.com"
    if name.endswith("url"):
        return "https://example.com/model.onnx"
    least: int = max(schema.get("minLength", 1), 1)
    candidates = ["1", "x" * least, "ref-1", "x" * least + "1"]
    pattern: str | None = schema.get("pattern")
    for candidate in candidates:
        if len(candidate) >= least and (pattern is None or re.search(pattern, candidate)):
            return candidate
    raise AssertionError(f"no minimal string for {name!r} ({schema}): add its body to BODIES")


ERROR_CODES = {401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT_FOUND", 409: "CONFLICT"}


def error_shaped(response: httpx.Response, status: int) -> bool:
    """The answer is `status` in the error shape of SPEC §1.8 with its code."""
    if response.status_code != status:
        return False
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return error.get("code") == ERROR_CODES[status] and bool(error.get("message"))


@dataclass
class Tally:
    """The cases of one matrix: how many, and which failed with what came back."""

    what: str
    cases: int = 0
    failures: list[str] = field(default_factory=list)

    def check(self, passed: bool, case: str, response: httpx.Response | None = None) -> None:
        self.cases += 1
        if not passed:
            got = (
                f" → {response.status_code} {response.text[:160]!r}" if response is not None else ""
            )
            self.failures.append(f"{case}{got}")

    @property
    def summary(self) -> str:
        return f"{self.what} {self.cases - len(self.failures)}/{self.cases}"

    def verdict(self, at_least: int) -> None:
        print(self.summary)
        assert self.cases >= at_least, f"{self.summary}: fewer cases than the routes promise"
        assert not self.failures, self.summary + "\n" + "\n".join(self.failures[:60])
