"""Error codes of the API (SPEC §1.8) and the JSON shape every error takes."""

from enum import StrEnum
from typing import Any

from pydantic import BaseModel


class ErrorCode(StrEnum):
    UNAUTHORIZED = "UNAUTHORIZED"
    FORBIDDEN = "FORBIDDEN"
    NOT_FOUND = "NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    CONFLICT = "CONFLICT"
    ARTIFACT_EXPIRED = "ARTIFACT_EXPIRED"
    GONE = "GONE"
    SESSION_CLOSED = "SESSION_CLOSED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    CHECKSUM_MISMATCH = "CHECKSUM_MISMATCH"
    RATE_LIMITED = "RATE_LIMITED"
    INSUFFICIENT_BALANCE = "INSUFFICIENT_BALANCE"
    SPENDING_LIMIT = "SPENDING_LIMIT"  # past the monthly cap the tenant set
    NO_CAPACITY = "NO_CAPACITY"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"
    # Reasons an invoke fails; they appear in an invoke's `error.code`, not as HTTP answers.
    DOWNLOAD_FAILED = "DOWNLOAD_FAILED"
    URL_FORBIDDEN = "URL_FORBIDDEN"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    INVALID_MODEL = "INVALID_MODEL"
    INVALID_INPUTS = "INVALID_INPUTS"
    INVALID_CONFIG = "INVALID_CONFIG"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    RESOURCE_LIMIT = "RESOURCE_LIMIT"  # past a provider's per-job limit; the message names it
    TIMEOUT = "TIMEOUT"
    CANCELED = "CANCELED"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    OUTPUT_UPLOAD_FAILED = "OUTPUT_UPLOAD_FAILED"
    AGENT_ERROR = "AGENT_ERROR"
    NODE_LOST = "NODE_LOST"
    NODE_QUARANTINED = "NODE_QUARANTINED"  # its node was caught cheating (docs/trust.md)
    IDLE_TIMEOUT = "IDLE_TIMEOUT"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.CONFLICT: 409,
    ErrorCode.ARTIFACT_EXPIRED: 410,
    ErrorCode.GONE: 410,
    ErrorCode.SESSION_CLOSED: 410,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.QUOTA_EXCEEDED: 413,
    ErrorCode.HEADERS_TOO_LARGE: 431,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.VALIDATION_ERROR: 422,
    ErrorCode.CHECKSUM_MISMATCH: 422,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.INSUFFICIENT_BALANCE: 402,
    ErrorCode.SPENDING_LIMIT: 402,
    ErrorCode.NO_CAPACITY: 503,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
}


def http_status(code: ErrorCode | str) -> int:
    try:
        return HTTP_STATUS[ErrorCode(code)]
    except (KeyError, ValueError):
        return 400


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorResponse(BaseModel):
    """`{"error": {"code", "message", "details"}}`: the body of every non-2xx answer."""

    error: ErrorDetail
