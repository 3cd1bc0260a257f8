"""The SSRF-safe fetcher against real HTTP servers on loopback addresses."""

import asyncio
import contextlib
import hashlib
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from ipaddress import ip_network
from pathlib import Path
from types import TracebackType

import pytest

from gpu_share.netguard import (
    ChecksumMismatch,
    FetchFailed,
    FetchTimeout,
    FetchTooLarge,
    SafeFetcher,
    UrlForbidden,
    UrlPolicy,
)
from gpu_share.protocol.errors import ErrorCode
from gpu_share.testing.servers import free_port

LOOPBACK = UrlPolicy(allow_networks=(ip_network("127.0.0.0/8"),))
MODEL = b"onnx-bytes " * 1000


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[Received, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> Received:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    request_line, *lines = head.split("\r\n")
    method, path, _ = request_line.split(" ", 2)
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while size := int((await reader.readline()).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
    return Received(method, path, headers, body)


async def respond(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    *,
    content_length: bool = True,
) -> None:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if content_length and "Content-Length" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()


@dataclass
class LoopbackServer:
    """A minimal HTTP/1.1 server (one request per connection) that records requests."""

    handler: Handler
    host: str = "127.0.0.1"
    ssl_context: ssl.SSLContext | None = None
    requests: list[Received] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> "LoopbackServer":
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, ssl=self.ssl_context
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def url(self, path: str = "/", *, host: str | None = None, scheme: str = "http") -> str:
        return f"{scheme}://{host or self.host}:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            received = await _read_request(reader)
            self.requests.append(received)
            await self.handler(received, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def serving(body: bytes = MODEL, headers: Mapping[str, str] | None = None) -> Handler:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        await respond(writer, 200, body, headers)

    return handler


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
async def fetcher() -> AsyncIterator[SafeFetcher]:
    async with SafeFetcher(LOOPBACK, retry_backoff=0.01) as f:
        yield f


async def test_download_stores_the_body_with_its_sha256(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    meta = {"Content-Type": "application/octet-stream", "ETag": '"v1"'}
    async with LoopbackServer(serving(MODEL, meta)) as server:
        dest = tmp_path / "cache" / "model.onnx"
        sha = hashlib.sha256(MODEL).hexdigest()
        result = await fetcher.download(
            server.url("/model.onnx"), dest, max_bytes=len(MODEL), timeout=5, expected_sha256=sha
        )
    assert dest.read_bytes() == MODEL
    assert (result.sha256, result.size, result.status_code) == (sha, len(MODEL), 200)
    assert (result.content_type, result.etag, result.not_modified) == (
        meta["Content-Type"],
        '"v1"',
        False,
    )
    assert server.requests[0].headers["user-agent"] == "gpu-share"
    assert leftovers(dest.parent) == ["model.onnx"]


async def test_download_by_host_name_sends_that_name_and_connects_to_its_checked_address(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async with LoopbackServer(serving()) as server:
        url = server.url("/m", host="localhost")
        result = await fetcher.download(url, tmp_path / "m", max_bytes=10**6, timeout=5)
    assert result.final_url == url
    assert server.requests[0].headers["host"] == f"localhost:{server.port}"


async def test_download_follows_relative_redirects_and_reports_the_final_url(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        if request.path == "/start":
            await respond(writer, 302, headers={"Location": "/final"})
        else:
            await respond(writer, 200, b"done")

    async with LoopbackServer(handler) as server:
        result = await fetcher.download(
            server.url("/start"), tmp_path / "f", max_bytes=10, timeout=5
        )
    assert result.final_url == server.url("/final")
    assert (tmp_path / "f").read_bytes() == b"done"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_default_policy_never_connects_to_loopback(host: str, tmp_path: Path) -> None:
    async with LoopbackServer(serving()) as server, SafeFetcher() as fetcher:
        with pytest.raises(UrlForbidden, match="a loopback address; only publicly routable"):
            await fetcher.download(
                server.url("/", host=host), tmp_path / "m", max_bytes=10**6, timeout=5
            )
    assert server.requests == []
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "location",
    ["http://127.0.0.1:{port}/secret", "http://localhost:{port}/secret", "file:///etc/passwd"],
)
async def test_redirect_to_a_forbidden_target_is_refused_and_never_fetched(
    location: str, tmp_path: Path
) -> None:
    async with LoopbackServer(serving(b"secret")) as target:

        async def redirector(request: Received, writer: asyncio.StreamWriter) -> None:
            await respond(writer, 302, headers={"Location": location.format(port=target.port)})

        async with (
            LoopbackServer(redirector, host="127.0.0.2") as public,
            SafeFetcher(UrlPolicy.from_strings(["127.0.0.2/32"])) as fetcher,
        ):
            with pytest.raises(UrlForbidden, match=r"loopback|only http:// and https://") as caught:
                await fetcher.download(
                    public.url("/model"), tmp_path / "m", max_bytes=100, timeout=5
                )
    assert "redirect" in caught.value.message
    assert len(public.requests) == 1
    assert target.requests == []
    assert leftovers(tmp_path) == []


async def test_too_many_redirects_fail(tmp_path: Path) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        hop = int(request.path.strip("/"))
        await respond(writer, 301, headers={"Location": f"/{hop + 1}"})

    async with LoopbackServer(handler) as server, SafeFetcher(LOOPBACK, max_redirects=2) as fetcher:
        with pytest.raises(FetchFailed, match="redirected more than 2 times"):
            await fetcher.download(server.url("/0"), tmp_path / "m", max_bytes=100, timeout=5)
    assert [r.path for r in server.requests] == ["/0", "/1", "/2"]


async def test_declared_oversize_is_refused_before_reading_the_body(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async with LoopbackServer(serving(MODEL)) as server:
        with pytest.raises(FetchTooLarge, match=f"is {len(MODEL)} bytes, over the 1000-byte limit"):
            await fetcher.download(server.url(), tmp_path / "m", max_bytes=1000, timeout=5)
    assert leftovers(tmp_path) == []


async def test_streamed_oversize_without_content_length_is_cut_off(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        await respond(writer, 200, MODEL * 100, content_length=False)

    async with LoopbackServer(handler) as server:
        with pytest.raises(FetchTooLarge, match="sent more than the 5000-byte limit") as caught:
            await fetcher.download(server.url(), tmp_path / "m", max_bytes=5000, timeout=5)
    assert caught.value.code == ErrorCode.PAYLOAD_TOO_LARGE
    assert leftovers(tmp_path) == []


async def test_a_slow_drip_server_hits_the_total_timeout(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        await respond(writer, 200, headers={"Content-Length": "1000"})
        for _ in range(1000):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.02)

    async with LoopbackServer(handler) as server:
        started = time.monotonic()
        with pytest.raises(FetchTimeout, match=r"did not finish within 0.4s"):
            await fetcher.download(server.url(), tmp_path / "m", max_bytes=10**6, timeout=0.4)
    assert time.monotonic() - started < 2
    assert leftovers(tmp_path) == []


async def test_checksum_mismatch_leaves_nothing_at_dest(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async with LoopbackServer(serving()) as server:
        with pytest.raises(ChecksumMismatch, match="but " + "0" * 64 + " was expected") as caught:
            await fetcher.download(
                server.url("/m?sig=secret"),
                tmp_path / "m",
                max_bytes=10**6,
                timeout=5,
                expected_sha256="0" * 64,
            )
    assert caught.value.code == ErrorCode.CHECKSUM_MISMATCH
    assert "secret" not in caught.value.message
    assert leftovers(tmp_path) == []


async def test_not_modified_answer_leaves_the_cached_copy_alone(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        if request.headers.get("if-none-match") == '"v1"':
            await respond(writer, 304, headers={"ETag": '"v1"'}, content_length=False)
        else:
            await respond(writer, 200, b"new")

    dest = tmp_path / "m"
    dest.write_bytes(b"cached")
    async with LoopbackServer(handler) as server:
        result = await fetcher.download(
            server.url(), dest, max_bytes=100, timeout=5, headers={"If-None-Match": '"v1"'}
        )
    assert result.not_modified and result.status_code == 304 and result.etag == '"v1"'
    assert dest.read_bytes() == b"cached"
    assert leftovers(tmp_path) == ["m"]


async def test_http_error_names_the_status_and_quotes_the_body(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        await respond(writer, 404, b"no such\nmodel " + b"x" * 5000)

    async with LoopbackServer(handler) as server:
        with pytest.raises(
            FetchFailed, match="answered GET with HTTP 404: no such model x"
        ) as caught:
            await fetcher.download(server.url("/m"), tmp_path / "m", max_bytes=100, timeout=5)
    assert len(caught.value.message) < 500
    assert caught.value.code == ErrorCode.DOWNLOAD_FAILED


async def test_connection_refused_is_a_download_failure(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}/m"
    with pytest.raises(FetchFailed, match="could not connect"):
        await fetcher.download(url, tmp_path / "m", max_bytes=100, timeout=5)


async def test_environment_proxies_are_ignored(
    monkeypatch: pytest.MonkeyPatch, fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async with LoopbackServer(serving(b"via proxy")) as proxy:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
            monkeypatch.setenv(name, proxy.url())
        monkeypatch.setenv("NO_PROXY", "")
        async with LoopbackServer(serving(b"direct")) as server, SafeFetcher(LOOPBACK) as fresh:
            await fresh.download(server.url(), tmp_path / "m", max_bytes=100, timeout=5)
    assert (tmp_path / "m").read_bytes() == b"direct"
    assert proxy.requests == []


async def test_cookies_from_one_fetch_are_not_sent_on_the_next(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    async with LoopbackServer(serving(b"x", {"Set-Cookie": "session=tenant-a; Path=/"})) as server:
        await fetcher.download(server.url(), tmp_path / "a", max_bytes=10, timeout=5)
        await fetcher.download(server.url(), tmp_path / "b", max_bytes=10, timeout=5)
    assert "cookie" not in server.requests[1].headers


async def test_probe_falls_back_to_a_one_byte_range_get_when_head_is_refused(
    fetcher: SafeFetcher,
) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        if request.method == "HEAD":
            await respond(writer, 405)
        else:
            headers = {"Content-Range": "bytes 0-0/12345", "Content-Type": "application/x-onnx"}
            await respond(writer, 206, b"o", headers)

    async with LoopbackServer(handler) as server:
        result = await fetcher.probe(server.url("/m"))
    assert (result.reachable, result.status_code, result.content_length) == (True, 206, 12345)
    assert result.content_type == "application/x-onnx" and result.error is None
    assert [(r.method, r.headers.get("range")) for r in server.requests] == [
        ("HEAD", None),
        ("GET", "bytes=0-0"),
    ]


async def test_probe_reports_head_answers(fetcher: SafeFetcher) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        status = 200 if request.path == "/m" else 404
        await respond(writer, status, headers={"Content-Length": "777"}, content_length=False)

    async with LoopbackServer(handler) as server:
        found = await fetcher.probe(server.url("/m"))
        missing = await fetcher.probe(server.url("/missing"))
    assert (found.reachable, found.status_code, found.content_length) == (True, 200, 777)
    assert (missing.reachable, missing.status_code, missing.error) == (
        False,
        404,
        "HTTP 404 Not Found",
    )


async def test_probe_of_a_forbidden_url_says_why_without_connecting() -> None:
    async with LoopbackServer(serving()) as server, SafeFetcher() as fetcher:
        result = await fetcher.probe(server.url(host="localhost"))
        scheme = await fetcher.probe("file:///etc/passwd")
    assert not result.reachable and result.status_code is None
    assert (
        result.error is not None and "localhost resolves to 127.0.0.1, a loopback" in result.error
    )
    assert scheme.error is not None and "only http:// and https://" in scheme.error
    assert server.requests == []


async def test_probe_of_a_dead_port_returns_unreachable(fetcher: SafeFetcher) -> None:
    result = await fetcher.probe(f"http://127.0.0.1:{free_port()}/", timeout=2)
    assert not result.reachable and result.error is not None and "could not connect" in result.error


async def test_upload_streams_the_file_and_retries_after_a_503(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    source = tmp_path / "outputs.npz"
    source.write_bytes(bytes(range(256)) * 4000)

    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        first = len(server.requests) == 1
        await respond(writer, 503 if first else 201, b"busy" if first else b"")

    async with LoopbackServer(handler) as server:
        status = await fetcher.upload(
            server.url("/put"), source, headers={"Content-Type": "application/zip"}, timeout=5
        )
    assert status == 201
    assert len(server.requests) == 2
    last = server.requests[-1]
    assert (last.method, last.body) == ("PUT", source.read_bytes())
    assert last.headers["content-length"] == str(source.stat().st_size)
    assert "transfer-encoding" not in last.headers
    assert last.headers["content-type"] == "application/zip"


async def test_upload_gives_up_after_its_attempts_with_the_last_answer(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    source = tmp_path / "out"
    source.write_bytes(b"data")

    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        await respond(writer, 500, b"disk full")

    async with LoopbackServer(handler) as server:
        with pytest.raises(FetchFailed, match="HTTP 500: disk full"):
            await fetcher.upload(server.url(), source, timeout=5, attempts=2)
    assert len(server.requests) == 2


@pytest.mark.parametrize(("status", "headers"), [(403, {}), (307, {"Location": "/elsewhere"})])
async def test_upload_does_not_retry_client_errors_or_follow_redirects(
    status: int, headers: dict[str, str], fetcher: SafeFetcher, tmp_path: Path
) -> None:
    source = tmp_path / "out"
    source.write_bytes(b"data")

    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        await respond(writer, status, b"nope", headers)

    async with LoopbackServer(handler) as server:
        with pytest.raises(FetchFailed, match=f"answered POST with HTTP {status}"):
            await fetcher.upload(server.url("/up"), source, method="POST", timeout=5)
    assert [r.path for r in server.requests] == ["/up"]


async def test_upload_to_an_unreachable_target_retries_then_fails(
    fetcher: SafeFetcher, tmp_path: Path
) -> None:
    source = tmp_path / "out"
    source.write_bytes(b"data")
    with pytest.raises(FetchFailed, match="failed after 3 attempts: could not connect"):
        await fetcher.upload(f"http://127.0.0.1:{free_port()}/", source, timeout=5)


async def test_upload_to_a_forbidden_url_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "out"
    source.write_bytes(b"data")
    async with SafeFetcher() as fetcher:
        with pytest.raises(UrlForbidden, match="private"):
            await fetcher.upload("http://10.0.0.8/bucket/out", source, timeout=5)


async def test_post_json_sends_the_payload_and_returns_any_status(fetcher: SafeFetcher) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> None:
        await respond(writer, 410 if request.path == "/gone" else 204)

    async with LoopbackServer(handler) as server:
        payload = {"event": "invoke.done", "id": "inv_1"}
        assert await fetcher.post_json(server.url("/hook"), payload, timeout=5) == 204
        assert await fetcher.post_json(server.url("/gone"), payload, timeout=5) == 410
    hook = server.requests[0]
    assert (hook.method, json.loads(hook.body)) == ("POST", payload)
    assert hook.headers["content-type"] == "application/json"


async def test_tls_to_a_pinned_address_still_verifies_the_host_name(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    make_cert = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    make_cert += " -days 1 -subj /CN=localhost -addext subjectAltName=DNS:localhost"
    make_cert += f" -keyout {key} -out {cert}"
    subprocess.run(make_cert.split(), check=True, capture_output=True)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    names: list[str | None] = []
    server_context.sni_callback = lambda _sock, name, _ctx: names.append(name)
    client_context = ssl.create_default_context(cafile=str(cert))

    async with (
        LoopbackServer(serving(b"secure"), ssl_context=server_context) as server,
        SafeFetcher(LOOPBACK, ssl_context=client_context) as fetcher,
    ):
        by_name = server.url("/m", host="localhost", scheme="https")
        await fetcher.download(by_name, tmp_path / "m", max_bytes=100, timeout=5)
        with pytest.raises(
            FetchFailed, match=r"could not connect.*(certificate|hostname|IP address)"
        ):
            await fetcher.download(
                server.url("/m", scheme="https"), tmp_path / "n", max_bytes=100, timeout=5
            )
    assert (tmp_path / "m").read_bytes() == b"secure"
    assert names[0] == "localhost"
