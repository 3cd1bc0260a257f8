"""The SSRF-safe fetcher every URL a tenant names goes through (coordinator and agent).

Imports only the standard library, httpx/httpcore/anyio and `gpu_share.protocol`.
"""

from gpu_share.netguard.fetcher import DownloadResult, ProbeResult, SafeFetcher
from gpu_share.netguard.policy import (
    ChecksumMismatch,
    FetchError,
    FetchFailed,
    FetchTimeout,
    FetchTooLarge,
    UrlForbidden,
    UrlPolicy,
)

__all__ = [
    "ChecksumMismatch",
    "DownloadResult",
    "FetchError",
    "FetchFailed",
    "FetchTimeout",
    "FetchTooLarge",
    "ProbeResult",
    "SafeFetcher",
    "UrlForbidden",
    "UrlPolicy",
]
