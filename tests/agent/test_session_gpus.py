"""A session's model process gets exactly the GPUs the coordinator named in the open
message, by UUID, through the sandbox every job goes through; an open naming GPUs the
node does not have fails the session saying so (SPEC §1.7, §4.3)."""

import hashlib
from pathlib import Path

import pytest

from gpu_share.agent.cache import ArtifactCache, Fetched
from gpu_share.agent.failures import JobFailed
from gpu_share.agent.gpu import Gpu
from gpu_share.agent.jobcontext import JobContext
from gpu_share.agent.sandbox import SandboxedProcess, SandboxSpec
from gpu_share.agent.sessions import SessionHost
from gpu_share.netguard import SafeFetcher, UrlPolicy
from gpu_share.protocol import agent as wire
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.sessions import OpenSession
from tests.agent.test_gpu_leases import make_agent

MODEL = b"not really onnx"
SHA = hashlib.sha256(MODEL).hexdigest()


class RecordingSandbox:
    """Records what it is asked to start and starts nothing."""

    name = "process"
    isolated = False

    def __init__(self) -> None:
        self.specs: list[SandboxSpec] = []

    async def start(self, spec: SandboxSpec) -> SandboxedProcess:
        self.specs.append(spec)
        raise JobFailed("SANDBOX_ERROR", "recorded, not started")


class Host(SessionHost):
    def __init__(self, ctx: JobContext, gpus: list[Gpu], failures: list[tuple[str, str]]) -> None:
        super().__init__(ctx, gpus)
        self.failures = failures

    async def _failed(self, session_id: str, code: str, message: str) -> None:
        self.failures.append((code, message))


async def open_on(
    tmp_path: Path, indices: list[int] | None
) -> tuple[list[SandboxSpec], list[tuple[str, str]], list[str]]:
    agent = make_agent(tmp_path)
    sandbox = RecordingSandbox()
    cache = ArtifactCache(agent.settings.cache_dir, 1 << 30)

    async def download(dest: Path, validators: dict[str, str]) -> Fetched:
        dest.write_bytes(MODEL)
        return Fetched(sha256=SHA, size=len(MODEL))

    cache.unpin((await cache.get_vouched(SHA, download)).sha256)
    failures: list[tuple[str, str]] = []
    async with SafeFetcher(UrlPolicy.from_strings([])) as fetcher:
        ctx = JobContext(
            agent.settings, agent.client, cache, fetcher, sandbox, agent.nvml, 1, slots=1
        )
        host = Host(ctx, agent.gpus, failures)
        await host._open(
            OpenSession(
                session_id="ses_1",
                runtime=RuntimeName.ONNX_CUDA,
                model=wire.ArtifactRef(url="https://example.com/m", platform=True, sha256=SHA),
                max_batch=None,
                max_concurrency=1,
                gpu_indices=indices,
            )
        )
    return sandbox.specs, failures, [g.info.uuid for g in agent.gpus]


async def test_a_session_gets_exactly_the_gpus_the_open_names(tmp_path: Path) -> None:
    specs, _, uuids = await open_on(tmp_path, [3, 1])
    (spec,) = specs
    assert spec.gpu_uuids == [uuids[3], uuids[1]]  # the model runs on the first


async def test_without_named_gpus_a_session_gets_the_first_gpu(tmp_path: Path) -> None:
    specs, _, uuids = await open_on(tmp_path, None)
    assert [spec.gpu_uuids for spec in specs] == [[uuids[0]]]


@pytest.mark.parametrize("indices", [[1, 7], []])
async def test_an_open_naming_gpus_the_node_lacks_fails_the_session(
    tmp_path: Path, indices: list[int]
) -> None:
    specs, failures, _ = await open_on(tmp_path, indices)
    assert specs == []  # nothing started
    ((code, message),) = failures
    assert code == "AGENT_ERROR" and str(indices) in message
