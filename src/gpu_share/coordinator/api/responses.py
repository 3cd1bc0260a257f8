"""OpenAPI descriptions of error answers, so every route documents what it can return."""

from typing import Any

from gpu_share.protocol.errors import ErrorResponse

_DESCRIPTIONS = {
    400: "Bad request",
    401: "Missing, malformed, unknown or revoked API key (UNAUTHORIZED)",
    402: (
        "Balance cannot cover the job (INSUFFICIENT_BALANCE), or it would pass the "
        "tenant's monthly cap (SPENDING_LIMIT)"
    ),
    403: "The key's role may not call this endpoint (FORBIDDEN)",
    404: "No such object, or not yours (NOT_FOUND)",
    409: "Conflicts with the object's state or an idempotency key (CONFLICT)",
    410: "The artifact expired (ARTIFACT_EXPIRED)",
    413: "Body over the size limit (PAYLOAD_TOO_LARGE) or over quota (QUOTA_EXCEEDED)",
    422: "Invalid input (VALIDATION_ERROR) or checksum mismatch (CHECKSUM_MISMATCH)",
    429: "Too many requests, e.g. failed key lookups, from this address (RATE_LIMITED)",
    503: "No capacity (NO_CAPACITY) or temporarily unavailable (UNAVAILABLE)",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: each listed status with the JSON error shape."""
    return {
        status: {"model": ErrorResponse, "description": _DESCRIPTIONS[status]}
        for status in statuses
    }


AUTH = (401, 403, 429)  # 429: too many failed key lookups from this address
