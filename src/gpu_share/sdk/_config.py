"""How a client is configured: arguments first, then `GPU_SHARE_*` variables, read at
construction (never at import), so a missing setting is an error with a fix rather
than the string "None" in a URL."""

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from gpu_share.sdk.errors import ConfigurationError

ENV_BASE_URL = "GPU_SHARE_BASE_URL"
ENV_API_KEY = "GPU_SHARE_API_KEY"
ENV_POLL_INTERVAL = "GPU_SHARE_POLL_INTERVAL"

DEFAULT_TIMEOUT = 30.0
DEFAULT_POLL_INTERVAL = 5.0  # the seed's "poll every 5–10 s"
DEFAULT_MAX_POLL_INTERVAL = 10.0
POLL_BACKOFF = 1.5


@dataclass(frozen=True)
class RetryPolicy:
    """When a request that is safe to repeat is sent again.

    Retried: transport errors, 429, 502, 503 and 504, after an exponential backoff with
    jitter (`backoff_base` × 2^(attempt-1), capped at `backoff_max`, a random half of it
    added or not) or the server's `Retry-After` when that is longer. A `Retry-After` over
    `max_retry_after` is not waited out: the error is raised at once and carries it.
    `503 NO_CAPACITY` is not retried unless `retry_no_capacity`: it means no node can
    take the job until a provider comes online, which is seldom a matter of seconds.
    """

    max_attempts: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_retry_after: float = 120.0
    retry_no_capacity: bool = False
    statuses: frozenset[int] = field(default=frozenset({429, 502, 503, 504}))

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError("RetryPolicy.max_attempts must be at least 1")

    def backoff(self, attempt: int) -> float:
        """The pause after failed attempt number `attempt` (1-based)."""
        ceiling = min(self.backoff_max, self.backoff_base * 2.0 ** (attempt - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 (jitter, not secrets)

    def pause(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before the next attempt, or None when there is none to make."""
        if attempt >= self.max_attempts:
            return None
        if retry_after is not None and retry_after > self.max_retry_after:
            return None
        return max(self.backoff(attempt), retry_after or 0.0)


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """`Retry-After` as seconds: either form of RFC 9110 (delta-seconds or an HTTP date)."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    if raw.isdigit():
        return float(raw)
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def normalize_base_url(value: str) -> str:
    value = value.strip().rstrip("/")
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as exc:
        raise ConfigurationError(f"base URL {value!r} is not a valid URL: {exc}") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigurationError(
            f"base URL {value!r} is not an http(s) URL; give the server's address, "
            "such as https://gpu-share.example or http://127.0.0.1:8080"
        )
    if url.query or url.fragment:
        raise ConfigurationError(f"base URL {value!r} must not carry a query or fragment")
    return value


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    api_key: str | None
    timeout: float = DEFAULT_TIMEOUT
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    poll_interval: float = DEFAULT_POLL_INTERVAL
    max_poll_interval: float = DEFAULT_MAX_POLL_INTERVAL
    progress: bool | None = None  # None: when stderr is a terminal

    @classmethod
    def resolve(
        cls,
        base_url: str | None,
        api_key: str | None,
        *,
        timeout: float,
        retry: RetryPolicy | None,
        poll_interval: float | None,
        max_poll_interval: float | None,
        progress: bool | None,
        environ: Mapping[str, str] | None = None,
    ) -> "ClientConfig":
        env = os.environ if environ is None else environ
        url = base_url or env.get(ENV_BASE_URL, "")
        if not url:
            raise ConfigurationError(
                f"no server address: pass base_url= (CLI: --base-url) or set {ENV_BASE_URL}, "
                "e.g. http://127.0.0.1:8080 for `gpu-share up`"
            )
        key = api_key or env.get(ENV_API_KEY) or None
        if poll_interval is None:
            poll_interval = _env_float(env, ENV_POLL_INTERVAL, DEFAULT_POLL_INTERVAL)
        if max_poll_interval is None:
            max_poll_interval = max(DEFAULT_MAX_POLL_INTERVAL, poll_interval)
        if poll_interval <= 0 or max_poll_interval < poll_interval:
            raise ConfigurationError(
                "poll_interval must be positive and max_poll_interval at least as long"
            )
        return cls(
            base_url=normalize_base_url(url),
            api_key=key.strip() if key else None,
            timeout=timeout,
            retry=retry or RetryPolicy(),
            poll_interval=poll_interval,
            max_poll_interval=max_poll_interval,
            progress=progress,
        )

    def headers(self) -> dict[str, str]:
        from gpu_share._version import __version__

        headers = {"User-Agent": f"gpu-share-python/{__version__}"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def same_origin(self, url: str) -> bool:
        """True for URLs of this server: the only ones the API key may be sent to."""
        try:
            theirs, ours = httpx.URL(url), httpx.URL(self.base_url)
        except httpx.InvalidURL:
            return False
        return (theirs.scheme, theirs.host, theirs.port) == (ours.scheme, ours.host, ours.port)


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not a number of seconds") from None
