"""Sessions (SPEC §1.7) as flows: a model kept loaded on a node, forwards at low latency.

`open` stages the model (uploading what is local), creates the session and waits
until it is ready; `forward` sends an NPZ of the inputs and decodes the NPZ that
comes back. Forwards are pure computation, so they are retried like reads.
"""

from collections.abc import Mapping
from typing import Any

from gpu_share.protocol.artifacts import ArtifactKind
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.sessions import Session, SessionCreate, SessionStatus
from gpu_share.sdk import _api, _npz
from gpu_share.sdk._config import ClientConfig
from gpu_share.sdk._http import ApiRequest, Flow, Offload, Sleep, parse, send
from gpu_share.sdk.errors import SessionFailed

READY_POLL_SEC = 0.2


def open_session(
    c: ClientConfig,
    model: _api.ArraysOrFile,
    runtime: RuntimeName | str,
    options: Mapping[str, Any],
    *,
    ready_timeout: float = 600.0,
) -> Flow[Session]:
    model_url, model_sha = yield from _api.stage(c, model, ArtifactKind.MODEL)
    body = _api.validated(
        SessionCreate,
        {"runtime": runtime, "model_url": model_url, "model_checksum_sha256": model_sha, **options},
    )
    response = yield from send(
        ApiRequest(
            "POST",
            "/v1/gpu/sessions",
            # gpus 0 and require_verified false left out: a coordinator from before them
            # accepts the body.
            json=body.model_dump(mode="json", exclude_none=True, exclude=_defaults_left_out(body)),
            safe=False,
        ),
        c,
    )
    session = parse(response, Session)
    waited = 0.0
    while session.status is SessionStatus.STARTING and waited < ready_timeout:
        yield Sleep(READY_POLL_SEC)
        waited += READY_POLL_SEC
        session = yield from get_session(c, session.id)
    if session.status is not SessionStatus.READY:
        raise SessionFailed(session)
    return session


def _defaults_left_out(body: SessionCreate) -> set[str] | None:
    left = {"gpus"} if body.gpus == 0 else set()
    if not body.require_verified:
        left.add("require_verified")
    return left or None


def get_session(c: ClientConfig, session_id: str) -> Flow[Session]:
    response = yield from send(ApiRequest("GET", f"/v1/gpu/sessions/{session_id}"), c)
    return parse(response, Session)


def close_session(c: ClientConfig, session_id: str) -> Flow[Session]:
    response = yield from send(ApiRequest("DELETE", f"/v1/gpu/sessions/{session_id}"), c)
    return parse(response, Session)


def forward(c: ClientConfig, session_id: str, inputs: Any) -> Flow[dict[str, Any]]:
    """`inputs`: a mapping of input name to array (or one array for a single-input model)."""
    payload: bytes = yield Offload(lambda: _npz.encode(inputs))
    response = yield from send(
        ApiRequest(
            "POST",
            f"/v1/gpu/sessions/{session_id}/forward",
            content=payload,
            headers={"Content-Type": "application/octet-stream"},
        ),
        c,
    )
    outputs: dict[str, Any] = yield Offload(lambda: _npz.decode(response.content))
    return outputs
