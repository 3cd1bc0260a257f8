"""The public surface: exported names, the drawn exception tree, what importing costs."""

import json
import re
import subprocess
import sys

import gpu_share
import gpu_share.sdk
from gpu_share.sdk import errors

ROOT_EXPORTS = {
    "__version__",
    "Client",
    "AsyncClient",
    "GpuShareError",
    "ConfigurationError",
    "ServerUnreachable",
    "UnexpectedResponse",
    "ApiError",
    "Unauthorized",
    "InsufficientBalance",
    "SpendingLimitReached",
    "Forbidden",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "ArtifactExpired",
    "Gone",
    "SessionClosed",
    "PayloadTooLarge",
    "QuotaExceeded",
    "UnsupportedMediaType",
    "ValidationError",
    "ChecksumMismatch",
    "RateLimited",
    "HeadersTooLarge",
    "InternalServerError",
    "ServiceUnavailable",
    "SessionFailed",
    "NoCapacity",
    "InvokeError",
    "InvokeFailed",
    "InvokeTimedOut",
    "InvokeCanceled",
    "WaitTimeout",
    "WebhookVerificationError",
    "verify_webhook",
}

SDK_EXTRAS = {
    "RetryPolicy",
    "InvokeOutputs",
    "InvokeOptions",
    "LogPage",
    "TrainedModel",
    "TrainingReport",
    "ENV_BASE_URL",
    "ENV_API_KEY",
    "ENV_POLL_INTERVAL",
    "errors",
}


def test_the_package_root_exports_the_clients_and_the_errors_only() -> None:
    assert set(gpu_share.__all__) == ROOT_EXPORTS
    for name in gpu_share.__all__:
        assert getattr(gpu_share, name) is not None
    assert gpu_share.Client is gpu_share.sdk.Client


def test_the_sdk_exports_exactly_its_public_names() -> None:
    assert set(gpu_share.sdk.__all__) == (ROOT_EXPORTS - {"__version__"}) | SDK_EXTRAS
    public = {name for name in vars(gpu_share.sdk) if not name.startswith("_")}
    assert public == set(gpu_share.sdk.__all__)


def test_every_exception_class_is_exported_and_drawn_in_the_tree_with_its_parent() -> None:
    assert errors.__doc__ is not None
    drawn: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        match = re.match(r"^(\s*(?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+)\s", line + " ")
        if not match:
            continue
        name = match.group(2)
        if not isinstance(getattr(errors, name, None), type):
            continue
        depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
        parents = [(d, n) for d, n in parents if d < depth]
        drawn[name] = parents[-1][1] if parents else "Exception"
        parents.append((depth, name))
    classes = {
        name: cls
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, errors.GpuShareError)
    }
    assert set(drawn) == set(classes)
    for name, cls in classes.items():
        assert cls.__bases__[0].__name__ == drawn[name], name
        assert name in gpu_share.__all__


def test_every_http_error_code_of_the_protocol_has_its_class() -> None:
    from gpu_share.protocol.errors import HTTP_STATUS

    assert set(errors.API_ERRORS) == {code.value for code in HTTP_STATUS}


def test_importing_the_sdk_costs_no_numpy_and_the_root_not_even_httpx() -> None:
    code = (
        "import sys, json; import gpu_share; root = sorted(sys.modules); import gpu_share.sdk; "
        "print(json.dumps([root, sorted(sys.modules)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    root, sdk = ({m.split(".")[0] for m in names} for names in json.loads(out.stdout))
    assert "httpx" not in root
    assert "numpy" not in sdk and "catboost" not in sdk
