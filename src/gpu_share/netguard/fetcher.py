"""The one way GPU Share fetches a URL a tenant named: download, probe, upload, webhook.

Connections go through `policy.checked_transport`, which connects only to addresses
it checked. Redirects are followed here, not by httpx, so every hop's URL is checked
too; environment proxies, `.netrc` and cookies are never used.
"""

import contextlib
import functools
import hashlib
import json
import os
import secrets
import ssl
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self

import anyio
import anyio.to_thread
import httpx

from gpu_share.netguard.policy import (
    ChecksumMismatch,
    FetchError,
    FetchFailed,
    FetchTimeout,
    FetchTooLarge,
    UrlForbidden,
    UrlPolicy,
    checked_transport,
)

_CHUNK = 256 * 1024
_EXCERPT_BYTES = 300
_CONDITIONAL = frozenset({"if-none-match", "if-modified-since"})
_DEFAULT_POLICY = UrlPolicy()


@dataclass(frozen=True)
class DownloadResult:
    """What a download stored. When `not_modified`, nothing was stored: `sha256` is ""
    and `size` is 0, and the caller's cached copy is still current."""

    sha256: str
    size: int
    status_code: int
    content_type: str | None
    etag: str | None
    last_modified: str | None
    final_url: str
    not_modified: bool


@dataclass(frozen=True)
class ProbeResult:
    """`reachable` means an HTTP answer below 400 came back; otherwise `error` says why."""

    reachable: bool
    status_code: int | None
    content_length: int | None
    content_type: str | None
    error: str | None


class _HashingWriter:
    """A temp file that hashes what is written; used from a worker thread."""

    def __init__(self, path: Path) -> None:
        self._file: BinaryIO = path.open("xb")
        self._digest = hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._digest.update(chunk)

    def finish(self) -> str:
        self._file.close()
        return self._digest.hexdigest()

    def close(self) -> None:
        self._file.close()


def _shown(url: httpx.URL) -> str:
    """The URL for messages, without its query: signed URLs carry secrets there."""
    query = "?…" if url.query else ""
    return f"{url.scheme}://{url.netloc.decode('ascii')}{url.path}{query}"


def _describe(exc: httpx.HTTPError) -> str:
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return f"could not connect ({detail})"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"the server broke the HTTP protocol ({detail})"
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
        return f"the connection broke ({detail})"
    return detail


@contextlib.contextmanager
def _translated(what: str, timeout: float) -> Iterator[None]:
    """httpx and timeout errors as FetchErrors; FetchErrors pass through."""
    try:
        yield
    except httpx.ConnectTimeout as exc:
        raise FetchFailed(f"{what} failed: could not connect in time ({exc})") from exc
    except (TimeoutError, httpx.TimeoutException):
        raise FetchTimeout(f"{what} did not finish within {timeout:g}s") from None
    except httpx.HTTPError as exc:
        raise FetchFailed(f"{what} failed: {_describe(exc)}") from exc


def _header_int(value: str | None) -> int | None:
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


async def _excerpt(response: httpx.Response) -> str:
    """The start of an error body, for messages; never reads more than a little."""
    received = b""
    with contextlib.suppress(httpx.HTTPError):
        async for chunk in response.aiter_raw(_EXCERPT_BYTES):
            received += chunk
            if len(received) >= _EXCERPT_BYTES:
                break
    text = received[:_EXCERPT_BYTES].decode("utf-8", "replace").strip()
    return f": {' '.join(text.split())}" if text else ""


async def _file_chunks(path: Path) -> AsyncGenerator[bytes, None]:
    async with await anyio.open_file(path, "rb") as file:
        while chunk := await file.read(_CHUNK):
            yield chunk


@functools.cache
def _public_trust() -> ssl.SSLContext:
    """The certifi trust store, loaded once per process: a load takes ~40 ms, and every
    coordinator app and agent makes a fetcher. One context serves any number of clients
    (they all speak HTTP/1.1, the one setting httpcore writes on it)."""
    return httpx.create_ssl_context(trust_env=False)


class SafeFetcher:
    """Fetches URLs that a tenant named, from inside an operator's network, safely."""

    def __init__(
        self,
        policy: UrlPolicy = _DEFAULT_POLICY,
        *,
        max_redirects: int = 5,
        connect_timeout: float = 10.0,
        user_agent: str = "gpu-share",
        ssl_context: ssl.SSLContext | None = None,
        retry_backoff: float = 0.5,
    ) -> None:
        """`ssl_context` replaces the certifi trust store (a private CA, tests);
        `retry_backoff` is the first pause between upload attempts, doubling after."""
        self.policy = policy
        self._max_redirects = max_redirects
        self._retry_backoff = retry_backoff
        context = ssl_context or _public_trust()
        self._client = httpx.AsyncClient(
            transport=checked_transport(policy, context),
            trust_env=False,
            follow_redirects=False,
            # What a server sends is what gets hashed and capped: no transparent gunzip.
            headers={"User-Agent": user_agent, "Accept-Encoding": "identity"},
            # Refuse every cookie, so one tenant's fetch never carries another's.
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
            timeout=httpx.Timeout(None, connect=connect_timeout),
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _open(
        self, method: str, url: httpx.URL, headers: Mapping[str, str] | None
    ) -> httpx.Response:
        """Send and follow redirects, checking each hop; the caller closes the response."""
        request = self._client.build_request(method, url, headers=headers)
        for hop in range(self._max_redirects + 1):
            try:
                response = await self._client.send(request, stream=True)
            except UrlForbidden as exc:
                if hop == 0:
                    raise
                raise UrlForbidden(
                    f"{exc.message} (reached by a redirect from {_shown(url)})"
                ) from None
            follow = response.next_request
            if follow is None:
                return response
            await response.aclose()
            if hop == self._max_redirects:
                break
            try:
                self.policy.check_url(str(follow.url))
            except UrlForbidden as exc:
                raise UrlForbidden(
                    f"{_shown(request.url)} redirects to {_shown(follow.url)}, "
                    f"which is refused: {exc.message}"
                ) from None
            request = follow
        raise FetchFailed(f"{_shown(url)} redirected more than {self._max_redirects} times")

    async def download(
        self,
        url: str,
        dest: Path,
        *,
        max_bytes: int,
        timeout: float,
        headers: Mapping[str, str] | None = None,
        expected_sha256: str | None = None,
    ) -> DownloadResult:
        """Stream `url` to `dest` (atomically, via a temp file beside it).

        `timeout` bounds the whole download, redirects included. With If-None-Match
        or If-Modified-Since in `headers`, a 304 leaves `dest` alone.
        """
        target = self.policy.check_url(url)
        conditional = any(name.lower() in _CONDITIONAL for name in headers or {})
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part")
        try:
            with _translated(f"downloading {_shown(target)}", timeout), anyio.fail_after(timeout):
                response = await self._open("GET", target, headers)
                try:
                    if response.status_code == 304 and conditional:
                        return self._result(response, "", 0, not_modified=True)
                    await self._raise_for_status(response, "GET")
                    declared = _header_int(response.headers.get("Content-Length"))
                    if declared is not None and declared > max_bytes:
                        raise FetchTooLarge(
                            f"{_shown(target)} is {declared} bytes, over the {max_bytes}-byte limit"
                        )
                    sha256, size = await self._store(response, part, max_bytes)
                finally:
                    await response.aclose()
            if expected_sha256 is not None and sha256 != expected_sha256.lower():
                raise ChecksumMismatch(
                    f"{_shown(target)} has sha256 {sha256}, but {expected_sha256} was expected"
                )
            os.replace(part, dest)
            return self._result(response, sha256, size, not_modified=False)
        finally:
            part.unlink(missing_ok=True)

    async def _store(self, response: httpx.Response, part: Path, max_bytes: int) -> tuple[str, int]:
        writer = await anyio.to_thread.run_sync(_HashingWriter, part)
        try:
            size = 0
            async for chunk in response.aiter_raw(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise FetchTooLarge(
                        f"{_shown(response.url)} sent more than the {max_bytes}-byte limit"
                    )
                await anyio.to_thread.run_sync(writer.write, chunk)
            return await anyio.to_thread.run_sync(writer.finish), size
        finally:
            writer.close()

    @staticmethod
    def _result(
        response: httpx.Response, sha256: str, size: int, *, not_modified: bool
    ) -> DownloadResult:
        return DownloadResult(
            sha256=sha256,
            size=size,
            status_code=response.status_code,
            content_type=response.headers.get("Content-Type"),
            etag=response.headers.get("ETag"),
            last_modified=response.headers.get("Last-Modified"),
            final_url=str(response.url),
            not_modified=not_modified,
        )

    @staticmethod
    async def _raise_for_status(response: httpx.Response, method: str) -> None:
        status = response.status_code
        if 200 <= status < 300:
            return
        shown = _shown(response.url)
        if 300 <= status < 400:
            location = response.headers.get("Location")
            why = "without a Location to follow" if location is None else "(not followed)"
            raise FetchFailed(f"{shown} answered {method} with HTTP {status} {why}")
        excerpt = await _excerpt(response)
        raise FetchFailed(f"{shown} answered {method} with HTTP {status}{excerpt}")

    async def probe(self, url: str, *, timeout: float = 10.0) -> ProbeResult:
        """Whether `url` answers, without downloading it. Never raises for the network."""
        try:
            target = self.policy.check_url(url)
            with _translated(f"probing {_shown(target)}", timeout), anyio.fail_after(timeout):
                response = await self._open("HEAD", target, None)
                if response.status_code in (405, 501):
                    await response.aclose()
                    response = await self._open("GET", target, {"Range": "bytes=0-0"})
                await response.aclose()  # the body is never read
        except FetchError as exc:
            return ProbeResult(False, None, None, None, exc.message)
        status = response.status_code
        length = _header_int(response.headers.get("Content-Length"))
        if status == 206:
            total = response.headers.get("Content-Range", "").rpartition("/")[2]
            length = _header_int(total)
        elif response.request.method == "GET" and status != 200:
            length = None
        reachable = status < 400
        return ProbeResult(
            reachable=reachable,
            status_code=status,
            content_length=length,
            content_type=response.headers.get("Content-Type"),
            error=None if reachable else f"HTTP {status} {response.reason_phrase}".strip(),
        )

    async def upload(
        self,
        url: str,
        source: Path,
        *,
        method: str = "PUT",
        headers: Mapping[str, str] | None = None,
        timeout: float,
        attempts: int = 3,
    ) -> int:
        """Stream `source` to `url`; retry connection errors, 5xx and 429 with backoff.

        `timeout` bounds all attempts together. Redirects are not followed: a 3xx is a
        failure, since the body would have to be sent again somewhere unchecked.
        """
        target = self.policy.check_url(url)
        shown = _shown(target)
        what = f"uploading {source.name} to {shown}"
        attempts = max(attempts, 1)
        with _translated(what, timeout), anyio.fail_after(timeout):
            for attempt in range(1, attempts + 1):
                last = attempt == attempts
                request_headers = httpx.Headers(headers)
                request_headers["Content-Length"] = str((await anyio.Path(source).stat()).st_size)
                async with contextlib.aclosing(_file_chunks(source)) as body:
                    request = self._client.build_request(
                        method, target, content=body, headers=request_headers
                    )
                    try:
                        response = await self._client.send(request, stream=True)
                    except httpx.TransportError as exc:
                        if last:
                            raise FetchFailed(
                                f"{what} failed after {attempt} attempts: {_describe(exc)}"
                            ) from exc
                        await anyio.sleep(self._retry_backoff * 2 ** (attempt - 1))
                        continue
                try:
                    status = response.status_code
                    if status < 300:
                        return status
                    if (status == 429 or status >= 500) and not last:
                        delay = self._retry_backoff * 2 ** (attempt - 1)
                        retry_after = _header_int(response.headers.get("Retry-After"))
                        if retry_after is not None:
                            delay = max(delay, min(retry_after, 60))
                        await response.aclose()  # before the pause, not after it
                        await anyio.sleep(delay)
                        continue
                    await self._raise_for_status(response, method)
                finally:
                    await response.aclose()
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def post_json(
        self,
        url: str,
        payload: Any,
        *,
        timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        """POST `payload` as JSON (for webhooks) and return the status, whatever it is.

        Raises only when no HTTP answer came back; redirects are not followed and
        nothing is retried, so the caller's delivery schedule stays the only one.
        """
        target = self.policy.check_url(url)
        body = json.dumps(payload, separators=(",", ":")).encode()
        request_headers = httpx.Headers(headers)
        request_headers.setdefault("Content-Type", "application/json")
        with _translated(f"posting to {_shown(target)}", timeout), anyio.fail_after(timeout):
            request = self._client.build_request(
                "POST", target, content=body, headers=request_headers
            )
            response = await self._client.send(request, stream=True)
            await response.aclose()
        return response.status_code
