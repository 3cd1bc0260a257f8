"""The coordinator's one error family.

Services raise these; `app.py` turns every one of them into the JSON error shape
of SPEC §1.8 in one place. Nothing here knows about HTTP beyond the status a code
maps to, which comes from the protocol.

    ApiError
    ├── Unauthorized          401 UNAUTHORIZED
    ├── Forbidden             403 FORBIDDEN
    ├── NotFound              404 NOT_FOUND
    ├── Conflict              409 CONFLICT
    ├── Gone                  410 ARTIFACT_EXPIRED | GONE
    ├── PayloadTooLarge       413 PAYLOAD_TOO_LARGE | QUOTA_EXCEEDED
    ├── ValidationFailed      422 VALIDATION_ERROR | CHECKSUM_MISMATCH
    ├── RateLimited           429 RATE_LIMITED
    ├── InsufficientBalance   402 INSUFFICIENT_BALANCE
    ├── SpendingLimitReached  402 SPENDING_LIMIT
    └── Unavailable           503 NO_CAPACITY | UNAVAILABLE
"""

from typing import Any, ClassVar

from gpu_share.protocol.errors import ErrorCode, http_status


class ApiError(Exception):
    default_code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        details: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.details = details
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return http_status(self.code)


class Unauthorized(ApiError):
    default_code = ErrorCode.UNAUTHORIZED

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("headers", {"WWW-Authenticate": "Bearer"})
        super().__init__(message, **kwargs)


class Forbidden(ApiError):
    default_code = ErrorCode.FORBIDDEN


class NotFound(ApiError):
    default_code = ErrorCode.NOT_FOUND


class Conflict(ApiError):
    default_code = ErrorCode.CONFLICT


class Gone(ApiError):
    default_code = ErrorCode.GONE


class PayloadTooLarge(ApiError):
    default_code = ErrorCode.PAYLOAD_TOO_LARGE


class ValidationFailed(ApiError):
    default_code = ErrorCode.VALIDATION_ERROR


class RateLimited(ApiError):
    default_code = ErrorCode.RATE_LIMITED


class InsufficientBalance(ApiError):
    default_code = ErrorCode.INSUFFICIENT_BALANCE


class SpendingLimitReached(ApiError):
    """New work would take the month's spend past the cap its tenant set."""

    default_code = ErrorCode.SPENDING_LIMIT


class Unavailable(ApiError):
    default_code = ErrorCode.UNAVAILABLE


def field_error(field: str, message: str, **kwargs: Any) -> ValidationFailed:
    """A 422 that names the field to fix, in the same shape as request validation."""
    return ValidationFailed(
        f"{field}: {message}",
        details=[{"loc": field.split("."), "msg": message}],
        **kwargs,
    )
