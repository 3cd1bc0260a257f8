"""Every exception the SDK raises; catch `GpuShareError` to catch them all.

    GpuShareError
    ├── ConfigurationError          no base URL, a malformed one, a missing extra (numpy, catboost)
    ├── ServerUnreachable           no answer: connection refused, DNS, TLS, timeout (after retries)
    ├── UnexpectedResponse          an answer not in GPU Share's shape (wrong base URL, proxy page)
    ├── ApiError                    the server answered an error: .status .code .message .details
    │   ├── Unauthorized            401 UNAUTHORIZED
    │   ├── InsufficientBalance     402 INSUFFICIENT_BALANCE
    │   ├── SpendingLimitReached    402 SPENDING_LIMIT: past the monthly cap you set
    │   ├── Forbidden               403 FORBIDDEN
    │   ├── NotFound                404 NOT_FOUND
    │   ├── MethodNotAllowed        405 METHOD_NOT_ALLOWED
    │   ├── Conflict                409 CONFLICT
    │   ├── ArtifactExpired         410 ARTIFACT_EXPIRED
    │   ├── Gone                    410 GONE
    │   ├── SessionClosed           410 SESSION_CLOSED: a forward to a session that ended
    │   ├── PayloadTooLarge         413 PAYLOAD_TOO_LARGE
    │   ├── QuotaExceeded           413 QUOTA_EXCEEDED
    │   ├── UnsupportedMediaType    415 UNSUPPORTED_MEDIA_TYPE
    │   ├── ValidationError         422 VALIDATION_ERROR (also raised before sending a bad body)
    │   ├── ChecksumMismatch        422 CHECKSUM_MISMATCH
    │   ├── RateLimited             429 RATE_LIMITED
    │   ├── HeadersTooLarge         431 HEADERS_TOO_LARGE
    │   ├── InternalServerError     500 INTERNAL
    │   ├── ServiceUnavailable      503 UNAVAILABLE
    │   └── NoCapacity              503 NO_CAPACITY
    ├── SessionFailed               a session did not become ready, or ended: .session
    ├── WebhookVerificationError    a webhook's signature, timestamp or headers do not check out
    └── InvokeError                 about one invoke's outcome: .invoke_id
        ├── InvokeFailed            it ended `failed`: .code .message .logs_tail .invoke .status
        │   ├── InvokeTimedOut      it ended `timeout`: the server killed it after timeout_sec
        │   └── InvokeCanceled      it ended `canceled`
        └── WaitTimeout             the SDK stopped waiting; the invoke itself goes on

An `ApiError` is rebuilt from the server's `{"error": {"code", "message", "details"}}`
by its code (the status only decides when the code is unknown), so a new server-side
code still arrives as an `ApiError` with the right `.status`. The classes are flat
under `ApiError`, one per code, so `except NotFound` never catches something else.
"""

from typing import Any, ClassVar

from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import Invoke
from gpu_share.protocol.sessions import Session


class GpuShareError(Exception):
    """The root of every SDK exception."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigurationError(GpuShareError):
    """The client cannot be used as configured; the message says what to set or install."""


class WebhookVerificationError(GpuShareError):
    """`verify_webhook` refused a delivery; the message says why (signature, age, header)."""


class ServerUnreachable(GpuShareError):
    """No HTTP answer came back from `url`, even after the retries the call allows."""

    def __init__(self, message: str, *, url: str, reason: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.reason = reason  # what the network said, e.g. "[Errno 111] Connection refused"


class UnexpectedResponse(GpuShareError):
    """Something answered, but not in GPU Share's shape."""

    def __init__(self, message: str, *, status: int, url: str, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.url = url
        self.body = body


class ApiError(GpuShareError):
    """The server refused the request; `code` is one of `gpu_share.protocol.errors.ErrorCode`."""

    code_name: ClassVar[ErrorCode | None] = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        code: str,
        details: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status  # None: refused by the SDK before anything was sent
        self.code = code
        self.details = details
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f"HTTP {self.status} " if self.status is not None else ""
        return f"{where}{self.code}: {self.message}"


class Unauthorized(ApiError):
    code_name = ErrorCode.UNAUTHORIZED


class InsufficientBalance(ApiError):
    code_name = ErrorCode.INSUFFICIENT_BALANCE


class SpendingLimitReached(ApiError):
    """New work would take this month's spend past the cap you set (`set_spending_limits`)."""

    code_name = ErrorCode.SPENDING_LIMIT


class Forbidden(ApiError):
    code_name = ErrorCode.FORBIDDEN


class NotFound(ApiError):
    code_name = ErrorCode.NOT_FOUND


class MethodNotAllowed(ApiError):
    code_name = ErrorCode.METHOD_NOT_ALLOWED


class Conflict(ApiError):
    code_name = ErrorCode.CONFLICT


class ArtifactExpired(ApiError):
    code_name = ErrorCode.ARTIFACT_EXPIRED


class Gone(ApiError):
    code_name = ErrorCode.GONE


class SessionClosed(ApiError):
    """The session ended (closed, idle timeout, its node lost); `.details["reason"]` says why."""

    code_name = ErrorCode.SESSION_CLOSED


class PayloadTooLarge(ApiError):
    code_name = ErrorCode.PAYLOAD_TOO_LARGE


class QuotaExceeded(ApiError):
    code_name = ErrorCode.QUOTA_EXCEEDED


class UnsupportedMediaType(ApiError):
    code_name = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class ValidationError(ApiError):
    code_name = ErrorCode.VALIDATION_ERROR


class ChecksumMismatch(ApiError):
    code_name = ErrorCode.CHECKSUM_MISMATCH


class RateLimited(ApiError):
    code_name = ErrorCode.RATE_LIMITED


class HeadersTooLarge(ApiError):
    code_name = ErrorCode.HEADERS_TOO_LARGE


class InternalServerError(ApiError):
    code_name = ErrorCode.INTERNAL


class ServiceUnavailable(ApiError):
    code_name = ErrorCode.UNAVAILABLE


class NoCapacity(ApiError):
    code_name = ErrorCode.NO_CAPACITY


API_ERRORS: dict[str, type[ApiError]] = {
    cls.code_name.value: cls
    for cls in (
        Unauthorized,
        InsufficientBalance,
        SpendingLimitReached,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        Conflict,
        ArtifactExpired,
        Gone,
        SessionClosed,
        PayloadTooLarge,
        QuotaExceeded,
        UnsupportedMediaType,
        ValidationError,
        ChecksumMismatch,
        RateLimited,
        HeadersTooLarge,
        InternalServerError,
        ServiceUnavailable,
        NoCapacity,
    )
    if cls.code_name is not None
}

# When an answer carries no code we know (a proxy's 502, an old server), the status decides.
_BY_STATUS: dict[int, type[ApiError]] = {
    401: Unauthorized,
    402: InsufficientBalance,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: ValidationError,
    429: RateLimited,
    431: HeadersTooLarge,
    500: InternalServerError,
    502: ServiceUnavailable,
    503: ServiceUnavailable,
    504: ServiceUnavailable,
}


def api_error(
    status: int | None,
    code: str,
    message: str,
    details: Any = None,
    retry_after: float | None = None,
) -> ApiError:
    """The exception for one error answer (or one refused request when `status` is None)."""
    cls = API_ERRORS.get(code) or (_BY_STATUS.get(status, ApiError) if status else ApiError)
    return cls(message, status=status, code=code, details=details, retry_after=retry_after)


class InvokeError(GpuShareError):
    """About one invoke rather than one HTTP request."""

    def __init__(self, message: str, *, invoke_id: str) -> None:
        super().__init__(message)
        self.invoke_id = invoke_id


class SessionFailed(GpuShareError):
    """A session failed to load its model or ended (node lost, idle timeout, deleted)."""

    def __init__(self, session: Session) -> None:
        error = session.error
        reason = f"{error.code}: {error.message}" if error else f"it is {session.status.value}"
        super().__init__(f"session {session.id} is {session.status.value}: {reason}")
        self.session = session


class InvokeFailed(InvokeError):
    """The invoke ended without outputs; `code` is the invoke's error code (INVALID_MODEL, …)."""

    def __init__(self, invoke: Invoke, logs_tail: str = "") -> None:
        code = invoke.error.code if invoke.error else invoke.status.value.upper()
        reason = invoke.error.message if invoke.error else f"ended {invoke.status.value}"
        message = f"invoke {invoke.id} {invoke.status.value}: {code}: {reason}"
        if logs_tail:
            message += f"\n--- last lines of its log ---\n{logs_tail}"
        super().__init__(message, invoke_id=invoke.id)
        self.invoke = invoke
        self.status = invoke.status
        self.code = code
        self.message = reason  # the invoke's own error message; str(exc) tells the whole story
        self.logs_tail = logs_tail


class InvokeTimedOut(InvokeFailed):
    """The job ran past its `timeout_sec` and the platform killed it."""


class InvokeCanceled(InvokeFailed):
    """Somebody canceled the invoke before it finished."""


class WaitTimeout(InvokeError):
    """`wait` gave up; the invoke keeps running and `get_invoke(invoke_id)` still finds it."""

    def __init__(self, invoke_id: str, waited: float, last_status: str) -> None:
        super().__init__(
            f"gave up waiting for invoke {invoke_id} after {waited:.0f} s; it is still "
            f"{last_status} and keeps going: check it later with get_invoke({invoke_id!r}) "
            f"or `gpu-share status {invoke_id}`, or cancel it",
            invoke_id=invoke_id,
        )
        self.waited = waited
        self.last_status = last_status
