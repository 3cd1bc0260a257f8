"""`Peers` over HTTP: the hop to the coordinator process holding a session
(`replica.peers`; the other side is `api.relay`)."""

import httpx

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.replica.peers import (
    ANSWER_FORMAT_HEADER,
    PURPOSE,
    TOKEN_HEADER,
    PeerAnswer,
    PeerUnreachable,
    RelayedOpen,
)
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.sessions import SessionStatus

CONNECT_TIMEOUT_SEC = 3.0
OPEN_TIMEOUT_SEC = 30.0  # the holder waits up to CREATE_WAIT_SEC for the model
FORWARD_TIMEOUT_SEC = 330.0  # beyond the holder's own (300 s), which answers 504 first


class HttpPeers:
    def __init__(self, signer: UrlSigner) -> None:
        self._signer = signer
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(OPEN_TIMEOUT_SEC, connect=CONNECT_TIMEOUT_SEC),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(
        self,
        relay_url: str,
        path: str,
        *,
        timeout: float = OPEN_TIMEOUT_SEC,
        **kwargs: object,
    ) -> httpx.Response:
        headers = {TOKEN_HEADER: self._signer.seal(PURPOSE, path)}
        try:
            response = await self._http.post(
                f"{relay_url}{path}",
                headers=headers,
                timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_SEC),
                **kwargs,  # type: ignore[arg-type]
            )
        except httpx.ConnectError as exc:  # refused: no process there any more
            raise PeerUnreachable(f"{relay_url}: {exc!r}", gone=True) from exc
        except httpx.TransportError as exc:
            raise PeerUnreachable(f"{relay_url}: {exc!r}") from exc
        if response.is_success:
            return response
        try:
            refusal = response.json()
            raise ApiError(
                str(refusal["message"]),
                code=ErrorCode(refusal["code"]),
                details=refusal.get("details"),
                headers=refusal.get("headers") or {},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise PeerUnreachable(
                f"{relay_url} answered {response.status_code} without a refusal"
            ) from exc

    async def open(self, relay_url: str, opening: RelayedOpen) -> None:
        body = {
            "tenant_id": opening.tenant_id,
            "node_id": opening.node_id,
            "idle_timeout_sec": opening.idle_timeout_sec,
            "message": opening.message.model_dump(mode="json"),
        }
        await self._post(relay_url, f"/relay/sessions/{opening.message.session_id}/open", json=body)

    async def forward(
        self, relay_url: str, tenant_id: str, session_id: str, fmt: str, payload: bytes
    ) -> PeerAnswer:
        response = await self._post(
            relay_url,
            f"/relay/sessions/{session_id}/forward",
            timeout=FORWARD_TIMEOUT_SEC,
            params={"tenant_id": tenant_id, "format": fmt},
            content=payload,
        )
        return PeerAnswer(
            format=response.headers.get(ANSWER_FORMAT_HEADER, fmt), body=response.content
        )

    async def close(
        self, relay_url: str, session_id: str, reason: str, status: SessionStatus
    ) -> None:
        await self._post(
            relay_url,
            f"/relay/sessions/{session_id}/close",
            json={"reason": reason, "status": status.value},
        )
