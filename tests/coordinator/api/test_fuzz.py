"""Generated requests for every operation of the OpenAPI document (schemathesis), against
a real server process on each database: no 5xx but the documented 503s, and no
unhandled error in the server's log. Bounded: a few dozen cases per operation."""

import contextlib
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from gpu_share.protocol.accounts import Role
from gpu_share.testing.factories import bearer
from gpu_share.testing.simulated_agent import inventory
from gpu_share.testing.stack import LiveStack
from tests.coordinator.api.operations import ENROLLMENT, Operation, roles_of

pytestmark = pytest.mark.slow

Case = Any  # schemathesis.Case, whose type parameters are its own business

CASES_PER_OPERATION = 24
DOCUMENTED_5XX = {503}
SERVER_LOG_ERRORS = ("Traceback", "unhandled error", "Exception in ASGI application")


def keys(stack: LiveStack) -> dict[Role | str, dict[str, str]]:
    """A caller of each role, and the enrollment token an agent registers with."""
    made = stack.http.post(
        "/v1/admin/providers", json={"name": "Fuzzed Farm", "email": "fuzzed@example.com"}
    )
    made.raise_for_status()
    token = made.json()["enrollment_token"]
    registered = stack.http.post(
        "/v1/agent/register",
        json={"inventory": inventory().model_dump(mode="json")},
        headers=bearer(token),
    )
    registered.raise_for_status()
    return {
        Role.ADMIN: bearer(stack.admin_key),
        Role.AGENT: bearer(registered.json()["node_key"]),
        Role.PROVIDER: bearer(made.json()["api_key"]),
        Role.TENANT: bearer(stack.tenant_key()),
        "enrollment": bearer(token),
    }


def headers_for(
    method: str, path: str, callers: dict[Role | str, dict[str, str]]
) -> dict[str, str]:
    """The key of a role the operation serves (`operations.roles_of`), so that generated
    requests get past the door to the code behind it; none for a public one."""
    operation = Operation(method.upper(), path, (), {})
    if operation.name in ENROLLMENT:
        return callers["enrollment"]
    roles = roles_of(operation)
    if roles is None:
        return {}
    return callers[min(roles, key=lambda role: role is Role.ADMIN)]  # not the admin's if another


def _no_long_waits(case: Case) -> None:
    """Long-polls answer after their wait; a fuzz run needs their answer, not the wait."""
    if isinstance(case.query, dict) and "wait" in case.query:
        case.query["wait"] = 0
    if isinstance(case.body, dict) and case.path == "/v1/agent/lease":
        case.body["wait_sec"] = 0  # absent, it means the default 25 s


def fuzz(
    strategy: st.SearchStrategy[Case],
    base_url: str,
    headers: dict[str, str],
    failures: list[str],
) -> None:
    @given(case=strategy)
    @settings(
        max_examples=CASES_PER_OPERATION // 2,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case: Case) -> None:
        _no_long_waits(case)
        try:
            response = case.call(base_url=base_url, headers=headers, timeout=30)
        except Exception as exc:  # the server dropped the connection: as bad as a 500
            failures.append(f"{case.method} {case.formatted_path}: {exc!r}")
            return
        if response.status_code >= 500 and response.status_code not in DOCUMENTED_5XX:
            failures.append(
                f"{case.method} {case.formatted_path} → {response.status_code}: "
                f"{response.text[:200]}"
            )

    with contextlib.suppress(Unsatisfiable):  # nothing to get wrong (e.g. no parameters)
        call()


# Each mode a test of its own: the whole run is the suite's longest test (~1 min a
# database), and halves let pytest-xdist spread it over its workers.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_generated_requests_never_get_an_undocumented_5xx(
    db_url: str, tmp_path: Path, mode: GenerationMode
) -> None:
    with LiveStack(tmp_path, agents=0, database_url=db_url) as stack:
        callers = keys(stack)
        schema = schemathesis.openapi.from_url(f"{stack.base_url}/openapi.json")
        failures: list[str] = []
        operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
        assert len(operations) > 30
        for operation in operations:
            headers = headers_for(operation.method, operation.path, callers)
            fuzz(operation.as_strategy(generation_mode=mode), stack.base_url, headers, failures)
        log = stack.server_log.read_text(errors="replace")
    assert not failures, "\n".join(failures[:20])
    for marker in SERVER_LOG_ERRORS:
        assert marker not in log, log[-4000:]
