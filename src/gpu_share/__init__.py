"""GPU Share: ONNX inference and CatBoost training on remote GPUs.

The package root offers the tenant SDK's clients and exceptions; they are imported on
first use, so that the coordinator, the agent and the runtimes, which import
`gpu_share.*` too, do not pay for the SDK.
"""

from typing import TYPE_CHECKING, Any

from gpu_share._version import __version__

if TYPE_CHECKING:
    from gpu_share.sdk import (
        ApiError,
        ArtifactExpired,
        AsyncClient,
        ChecksumMismatch,
        Client,
        ConfigurationError,
        Conflict,
        Forbidden,
        Gone,
        GpuShareError,
        HeadersTooLarge,
        InsufficientBalance,
        InternalServerError,
        InvokeCanceled,
        InvokeError,
        InvokeFailed,
        InvokeTimedOut,
        MethodNotAllowed,
        NoCapacity,
        NotFound,
        PayloadTooLarge,
        QuotaExceeded,
        RateLimited,
        ServerUnreachable,
        ServiceUnavailable,
        SessionClosed,
        SessionFailed,
        SpendingLimitReached,
        Unauthorized,
        UnexpectedResponse,
        UnsupportedMediaType,
        ValidationError,
        WaitTimeout,
        WebhookVerificationError,
        verify_webhook,
    )

__all__ = [
    "ApiError",
    "ArtifactExpired",
    "AsyncClient",
    "ChecksumMismatch",
    "Client",
    "ConfigurationError",
    "Conflict",
    "Forbidden",
    "Gone",
    "GpuShareError",
    "HeadersTooLarge",
    "InsufficientBalance",
    "InternalServerError",
    "InvokeCanceled",
    "InvokeError",
    "InvokeFailed",
    "InvokeTimedOut",
    "MethodNotAllowed",
    "NoCapacity",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RateLimited",
    "ServerUnreachable",
    "ServiceUnavailable",
    "SessionClosed",
    "SessionFailed",
    "SpendingLimitReached",
    "Unauthorized",
    "UnexpectedResponse",
    "UnsupportedMediaType",
    "ValidationError",
    "WaitTimeout",
    "WebhookVerificationError",
    "__version__",
    "verify_webhook",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gpu_share import sdk

        value = getattr(sdk, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gpu_share' has no attribute {name!r}")
