"""The agent's fetch of a job's input against real HTTP servers on loopback: what its
cache may hand a job, and what only the origin may."""

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi import FastAPI, Request, Response

from gpu_share.agent.cache import ArtifactCache
from gpu_share.agent.client import CoordinatorClient
from gpu_share.agent.failures import JobFailed
from gpu_share.agent.fetching import fetch
from gpu_share.agent.settings import AgentSettings
from gpu_share.netguard import SafeFetcher, UrlPolicy
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.testing.servers import serve

SECRET = b"tenant A's inputs " * 500
SECRET_SHA = hashlib.sha256(SECRET).hexdigest()
UNRESOLVABLE = "http://inputs.invalid/digits.npz"  # RFC 6761: never resolves


@dataclass
class Origin:
    """A file server with ETags that records what it was asked."""

    files: dict[str, bytes] = field(default_factory=dict)
    seen: list[tuple[str, str | None]] = field(default_factory=list)  # path, If-None-Match
    always_304: bool = False
    before_304: list[Path] = field(default_factory=list)  # files to delete first

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/{name}")
        async def get(name: str, request: Request) -> Response:
            condition = request.headers.get("if-none-match")
            self.seen.append((name, condition))
            body = self.files.get(name)
            if self.always_304:
                return Response(status_code=304)
            if body is None:
                return Response(status_code=404)
            etag = f'"{hashlib.sha256(body).hexdigest()[:16]}"'
            if condition == etag:
                for path in self.before_304:
                    path.unlink()
                return Response(status_code=304, headers={"ETag": etag})
            return Response(body, headers={"ETag": etag})

        return app


@dataclass
class Node:
    cache: ArtifactCache
    settings: AgentSettings
    client: CoordinatorClient
    fetcher: SafeFetcher

    async def fetch(self, url: str, sha256: str | None, *, platform: bool = False) -> bytes:
        ref = wire.ArtifactRef(url=url, platform=platform, sha256=sha256, size=None)
        cached = await fetch(
            ref,
            "inputs_url",
            settings=self.settings,
            cache=self.cache,
            client=self.client,
            fetcher=self.fetcher,
        )
        self.cache.unpin(cached.sha256)
        return cached.path.read_bytes()


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    settings = AgentSettings(server="http://127.0.0.1:9", data_dir=tmp_path / "agent")
    client = CoordinatorClient(settings.server)
    async with SafeFetcher(UrlPolicy.from_strings(["127.0.0.0/8"])) as fetcher:
        yield Node(ArtifactCache(settings.cache_dir, 1 << 30), settings, client, fetcher)
    await client.aclose()


async def test_a_cached_checksum_named_with_an_unresolvable_url_fails_to_download(
    node: Node,
) -> None:
    origin = Origin(files={"a.npz": SECRET})
    async with serve(origin.app()) as base_url:
        assert await node.fetch(f"{base_url}/a.npz", SECRET_SHA) == SECRET
    with pytest.raises(JobFailed) as failed:
        await node.fetch(UNRESOLVABLE, SECRET_SHA)
    assert failed.value.code == ErrorCode.DOWNLOAD_FAILED
    assert "inputs_url: cannot resolve host 'inputs.invalid'" in failed.value.message


async def test_a_platform_artifacts_checksum_does_not_open_the_cache_to_an_external_url(
    node: Node,
) -> None:
    platform = Origin(files={"artifact": SECRET})
    async with serve(platform.app()) as base_url:
        url = f"{base_url}/artifact"
        assert await node.fetch(url, SECRET_SHA, platform=True) == SECRET
        assert await node.fetch(url, SECRET_SHA, platform=True) == SECRET
    assert len(platform.seen) == 1  # the coordinator vouches for its checksum: a cache hit
    with pytest.raises(JobFailed) as failed:
        await node.fetch(UNRESOLVABLE, SECRET_SHA)
    assert failed.value.code == ErrorCode.DOWNLOAD_FAILED


async def test_an_origin_that_answers_304_to_anything_gets_nothing_from_the_cache(
    node: Node,
) -> None:
    honest, liar = Origin(files={"a.npz": SECRET}), Origin(always_304=True)
    async with serve(honest.app()) as honest_url, serve(liar.app()) as liar_url:
        assert await node.fetch(f"{honest_url}/a.npz", SECRET_SHA) == SECRET
        with pytest.raises(JobFailed) as failed:
            await node.fetch(f"{liar_url}/a.npz", SECRET_SHA)
    assert failed.value.code == ErrorCode.DOWNLOAD_FAILED
    assert liar.seen == [("a.npz", None)]  # asked without validators: it never sent a file


async def test_a_known_url_is_revalidated_and_served_from_the_cache_on_304(node: Node) -> None:
    origin = Origin(files={"a.npz": SECRET})
    async with serve(origin.app()) as base_url:
        assert await node.fetch(f"{base_url}/a.npz", SECRET_SHA) == SECRET
        assert await node.fetch(f"{base_url}/a.npz", SECRET_SHA) == SECRET
    etag = f'"{SECRET_SHA[:16]}"'
    assert origin.seen == [("a.npz", None), ("a.npz", etag)]


async def test_a_url_whose_content_changed_is_checked_against_the_tenants_checksum(
    node: Node,
) -> None:
    origin = Origin(files={"a.npz": SECRET})
    async with serve(origin.app()) as base_url:
        assert await node.fetch(f"{base_url}/a.npz", SECRET_SHA) == SECRET
        origin.files["a.npz"] = b"something else"
        with pytest.raises(JobFailed) as failed:
            await node.fetch(f"{base_url}/a.npz", SECRET_SHA)
        assert await node.fetch(f"{base_url}/a.npz", None) == b"something else"
    assert failed.value.code == ErrorCode.CHECKSUM_MISMATCH


async def test_an_object_evicted_while_the_origin_confirms_it_is_downloaded_again(
    node: Node,
) -> None:
    origin = Origin(files={"a.npz": SECRET})
    async with serve(origin.app()) as base_url:
        assert await node.fetch(f"{base_url}/a.npz", None) == SECRET
        origin.before_304.append(node.settings.cache_dir / "objects" / SECRET_SHA)
        assert await node.fetch(f"{base_url}/a.npz", None) == SECRET
    assert [condition is None for _, condition in origin.seen] == [True, False, True]
