"""A small Solana JSON-RPC client: the only code that speaks to the operator's RPC node.

Transport failures, HTTP 5xx/429 and the node's "try again" errors are retried with the
project's one backoff (`gpu_share.backoff`), a few times, then raised as
`RpcUnavailable`. Any other error the node answers is `RpcRejected`, with its code and
message (for sendTransaction: the transaction was refused and did not land).
"""

import base64
from dataclasses import dataclass
from typing import Any

import httpx

from gpu_share.backoff import Backoff

# JSON-RPC codes a node answers when it is behind or busy: worth another try.
_TRANSIENT_CODES = frozenset({-32005, -32004, -32014, -32016, -32603})


class RpcUnavailable(Exception):
    """The RPC node could not be reached or kept failing; nothing is known of the request."""


class RpcRejected(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Blockhash:
    blockhash: str
    last_valid_block_height: int


@dataclass(frozen=True)
class SignatureStatus:
    confirmation: str | None  # "processed", "confirmed" or "finalized"
    err: Any  # None when the transaction succeeded


class SolanaRpc:
    def __init__(
        self,
        url: str,
        *,
        commitment: str = "confirmed",
        timeout_sec: float = 10.0,
        attempts: int = 3,
        retry_first_sec: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.commitment = commitment
        self._attempts = max(1, attempts)
        self._retry_first = retry_first_sec
        self._client = httpx.AsyncClient(timeout=timeout_sec, transport=transport)
        self._next_id = 0

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> "SolanaRpc":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def call(self, method: str, params: list[Any]) -> Any:
        delay = Backoff(first=self._retry_first, cap=max(self._retry_first, 5.0))
        last = "no answer"
        for attempt in range(self._attempts):
            if attempt:
                await delay.sleep()
            self._next_id += 1
            body = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
            try:
                answer = await self._client.post(self.url, json=body)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
                continue
            if answer.status_code == 429 or answer.status_code >= 500:
                last = f"HTTP {answer.status_code}"
                continue
            try:
                reply = answer.json()
            except ValueError:
                last = f"HTTP {answer.status_code}, not JSON"
                continue
            error = reply.get("error") if isinstance(reply, dict) else None
            if error is not None:
                code, message = int(error.get("code", 0)), str(error.get("message", ""))
                if code in _TRANSIENT_CODES:
                    last = f"{message} ({code})"
                    continue
                raise RpcRejected(code, message)
            if not isinstance(reply, dict) or "result" not in reply:
                last = "an answer without a result"
                continue
            return reply["result"]
        raise RpcUnavailable(f"Solana RPC {method} failed {self._attempts} times: {last}")

    async def latest_blockhash(self) -> Blockhash:
        result = await self.call("getLatestBlockhash", [{"commitment": self.commitment}])
        value = result["value"]
        return Blockhash(value["blockhash"], int(value["lastValidBlockHeight"]))

    async def block_height(self, commitment: str | None = None) -> int:
        params = [{"commitment": commitment or self.commitment}]
        return int(await self.call("getBlockHeight", params))

    async def account_exists(self, address: str) -> bool:
        result = await self.call(
            "getAccountInfo", [address, {"encoding": "base64", "commitment": self.commitment}]
        )
        return result.get("value") is not None

    async def send_transaction(self, transaction: bytes) -> str:
        """The signature the node answers; RpcRejected when it refused the transaction."""
        encoded = base64.b64encode(transaction).decode()
        options = {
            "encoding": "base64",
            "preflightCommitment": self.commitment,
            "maxRetries": 0,  # the payout loop resends while the blockhash is valid
        }
        return str(await self.call("sendTransaction", [encoded, options]))

    async def signature_status(self, signature: str) -> SignatureStatus | None:
        """None when the cluster does not know the signature (yet, or ever)."""
        result = await self.call(
            "getSignatureStatuses", [[signature], {"searchTransactionHistory": True}]
        )
        [status] = result["value"]
        if status is None:
            return None
        return SignatureStatus(status.get("confirmationStatus"), status.get("err"))

    async def signatures_for_address(self, address: str, limit: int = 1000) -> list[dict[str, Any]]:
        """The finalized transactions that name `address`, newest first: each with its
        `signature` and `err`."""
        options = {"commitment": "finalized", "limit": limit}
        result = await self.call("getSignaturesForAddress", [address, options])
        return list(result)

    async def transaction(self, signature: str) -> dict[str, Any] | None:
        """The finalized transaction with its `meta` (token balances before and after)."""
        options = {
            "encoding": "json",
            "commitment": "finalized",
            "maxSupportedTransactionVersion": 0,
        }
        result = await self.call("getTransaction", [signature, options])
        return dict(result) if result is not None else None
