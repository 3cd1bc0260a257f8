"""The tenant SDK: `Client` (blocking) and `AsyncClient` (asyncio), built on httpx.

    from gpu_share import Client

    with Client() as client:          # GPU_SHARE_BASE_URL, GPU_SHARE_API_KEY
        out = client.invoke_and_wait("onnx_cpu", "model.onnx", {"input": batch})
        print(out["label"])

The wire models (`Invoke`, `Artifact`, `Node`, …) are the coordinator's own, from
`gpu_share.protocol`. numpy and catboost are needed only by the calls that take or
return arrays and models, and are imported only then.
"""

from gpu_share.sdk import errors
from gpu_share.sdk._api import InvokeOptions, LogPage
from gpu_share.sdk._async_client import AsyncClient
from gpu_share.sdk._catboost import TrainedModel, TrainingReport
from gpu_share.sdk._client import Client
from gpu_share.sdk._config import ENV_API_KEY, ENV_BASE_URL, ENV_POLL_INTERVAL, RetryPolicy
from gpu_share.sdk._results import InvokeOutputs
from gpu_share.sdk._webhooks import verify_webhook
from gpu_share.sdk.errors import (
    ApiError,
    ArtifactExpired,
    ChecksumMismatch,
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
)

__all__ = [
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "ENV_POLL_INTERVAL",
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
    "InvokeOptions",
    "InvokeOutputs",
    "InvokeTimedOut",
    "LogPage",
    "MethodNotAllowed",
    "NoCapacity",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RateLimited",
    "RetryPolicy",
    "ServerUnreachable",
    "ServiceUnavailable",
    "SessionClosed",
    "SessionFailed",
    "SpendingLimitReached",
    "TrainedModel",
    "TrainingReport",
    "Unauthorized",
    "UnexpectedResponse",
    "UnsupportedMediaType",
    "ValidationError",
    "WaitTimeout",
    "WebhookVerificationError",
    "errors",
    "verify_webhook",
]
