"""The Docker sandbox: what it asks the engine for, and how it is found (no engine runs here).

The container kwargs are a pure function, checked whole. The job plumbing (log thread,
wait, kill) runs against a stand-in container with the SDK's method names, since a
real engine is not available on this machine.
"""

import asyncio
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpu_share.agent.sandbox import (
    DockerSandbox,
    JobLimits,
    SandboxError,
    SandboxSpec,
    SandboxUnavailable,
    detect_sandbox,
)
from gpu_share.agent.sandbox.docker import JOB_LABEL, container_kwargs


def spec_for(tmp_path: Path, **fields: Any) -> SandboxSpec:
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)
    return SandboxSpec(
        argv=fields.pop(
            "argv", [sys.executable, "-m", "gpu_share.agent.runtimes.onnx", "spec.json"]
        ),
        job_dir=job_dir,
        inputs=fields.pop("inputs", {}),
        env=fields.pop("env", {"GPUSHARE_JOB": "7"}),
        **fields,
    )


def test_container_is_locked_down_and_sees_only_its_folder(tmp_path: Path) -> None:
    blob = tmp_path / "cache" / "0123abcd"
    blob.parent.mkdir()
    blob.write_bytes(b"model")
    spec = spec_for(tmp_path, inputs={"model.onnx": blob}, cpu_threads=2)
    kwargs = container_kwargs(spec, image="gpu-share:test", pids_limit=256)
    assert kwargs.pop("environment") == {
        "HOME": "/job",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "GPUSHARE_JOB": "7",
        "OMP_NUM_THREADS": "2",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "NVIDIA_VISIBLE_DEVICES": "void",
    }
    assert kwargs.pop("tmpfs") == {"/tmp": "rw,nosuid,nodev,size=1073741824"}
    assert kwargs == {
        "image": "gpu-share:test",
        "command": ["python", "-m", "gpu_share.agent.runtimes.onnx", "spec.json"],
        "working_dir": "/job",
        "user": "65534:65534",
        "hostname": "gpu-share-job",
        "labels": {JOB_LABEL: str(spec.job_dir.resolve())},
        "network_disabled": True,
        "network_mode": "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": 256,
        "init": True,
        "mounts": [
            {
                "Type": "bind",
                "Source": str(spec.job_dir.resolve()),
                "Target": "/job",
                "ReadOnly": False,
            },
            {"Type": "bind", "Source": str(blob), "Target": "/job/in/model.onnx", "ReadOnly": True},
        ],
        "stdin_open": False,
        "tty": False,
    }


def test_container_gets_only_the_assigned_gpus(tmp_path: Path) -> None:
    kwargs = container_kwargs(spec_for(tmp_path, gpu_uuids=["GPU-a", "GPU-b"]), image="i")
    assert kwargs["device_requests"] == [
        {"device_ids": ["GPU-a", "GPU-b"], "capabilities": [["gpu"]]}
    ]
    assert kwargs["environment"]["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert "device_requests" not in container_kwargs(spec_for(tmp_path), image="i")


def test_device_requests_are_what_the_sdk_accepts(tmp_path: Path) -> None:
    types_module = pytest.importorskip("docker.types")
    (request,) = container_kwargs(spec_for(tmp_path, gpu_uuids=["GPU-a"]), image="i")[
        "device_requests"
    ]
    sdk = types_module.DeviceRequest(**request)
    assert sdk == types_module.DeviceRequest(device_ids=["GPU-a"], capabilities=[["gpu"]])


def test_one_cached_file_may_appear_under_two_names(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"x")
    spec = spec_for(tmp_path, inputs={"a.npz": blob, "b.npz": blob})
    targets = [m["Target"] for m in container_kwargs(spec, image="i")["mounts"]]
    assert targets == ["/job", "/job/in/a.npz", "/job/in/b.npz"]


def test_other_programs_and_a_chosen_path_pass_through(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, argv=["/opt/tool", "--x"], env={"PATH": "/opt/bin"})
    kwargs = container_kwargs(spec, image="i", python="python3")
    assert kwargs["command"] == ["/opt/tool", "--x"]
    assert kwargs["environment"]["PATH"] == "/opt/bin"


def test_bad_input_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxError):
        container_kwargs(spec_for(tmp_path, inputs={"../x": tmp_path}), image="i")


def test_explicit_docker_without_an_engine_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(SandboxUnavailable) as raised:
        detect_sandbox("docker")
    message = str(raised.value)
    assert "install Docker Engine" in message and "docs.docker.com" in message


def fake_docker_module(client: Any) -> types.ModuleType:
    module = types.ModuleType("docker")

    def from_env(timeout: int = 60) -> Any:
        return client

    module.from_env = from_env  # type: ignore[attr-defined]
    return module


class Unreachable:
    def ping(self) -> bool:
        raise ConnectionRefusedError("connection refused")


class Engine:
    """Answers like an engine with the NVIDIA runtime; `image_present` says if the image is."""

    def __init__(self, *, image_present: bool = True) -> None:
        self.images = self
        self.image_present = image_present

    def ping(self) -> bool:
        return True

    def info(self) -> dict[str, Any]:
        return {"Runtimes": {"runc": {}, "nvidia": {}}}

    def get(self, image: str) -> object:
        if not self.image_present:
            raise LookupError(f"No such image: {image}")
        return object()


def test_explicit_docker_when_the_engine_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", fake_docker_module(Unreachable()))
    with pytest.raises(SandboxUnavailable, match="no Docker engine answered"):
        detect_sandbox("docker")


def test_explicit_docker_without_the_sdk_says_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)
    with pytest.raises(SandboxUnavailable, match="pip install docker"):
        detect_sandbox("docker")


def test_docker_is_chosen_when_the_engine_and_image_are_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "docker", fake_docker_module(Engine()))
    sandbox = detect_sandbox("auto", docker_image="gpu-share:test")
    assert isinstance(sandbox, DockerSandbox) and sandbox.image == "gpu-share:test"


def test_auto_passes_over_docker_without_the_runtime_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", fake_docker_module(Engine(image_present=False)))
    with pytest.raises(SandboxUnavailable, match="docker pull gpu-share:test"):
        detect_sandbox("docker", docker_image="gpu-share:test")
    assert detect_sandbox("auto", docker_image="gpu-share:test").name != "docker"


class Container:
    """The SDK container methods the sandbox uses; exits with `status` or when removed."""

    def __init__(self, status: int | None) -> None:
        self.id = "c0ffee"
        self.attrs = {"State": {"Pid": 4242}}
        self.status = status
        self.removed = threading.Event()
        self.started = False

    def start(self) -> None:
        self.started = True

    def reload(self) -> None:
        pass

    def logs(self, **options: Any) -> Iterator[bytes]:
        assert options == {"stream": True, "follow": True, "stdout": True, "stderr": True}
        yield b"hello\n"
        if self.status is None:
            self.removed.wait(10)
            raise ConnectionError("container removed")
        yield b"done\n"

    def wait(self) -> dict[str, int]:
        if self.status is None:
            self.removed.wait(10)
            raise LookupError("No such container")
        return {"StatusCode": self.status}

    def remove(self, *, force: bool = False) -> None:
        assert force
        self.removed.set()


class Client:
    def __init__(self, container: Container) -> None:
        self.containers = self
        self.container = container
        self.created: dict[str, Any] = {}

    def create(self, **kwargs: Any) -> Container:
        self.created = kwargs
        return self.container


async def test_job_streams_the_container_log_and_its_exit_status(tmp_path: Path) -> None:
    client = Client(Container(status=139))
    sandbox = DockerSandbox(client=client, image="gpu-share:test")
    spec = spec_for(tmp_path, inputs={"m": tmp_path / "job"})
    job = await sandbox.start(spec)
    assert client.created == sandbox.container_kwargs(spec)
    assert client.container.started and job.pid == 4242
    assert await asyncio.wait_for(job.stdout.read(), 5) == b"hello\ndone\n"
    assert await asyncio.wait_for(job.wait(), 5) == -11  # 128 + SIGSEGV
    assert client.container.removed.is_set()
    if os.geteuid() == 0:
        assert spec.job_dir.stat().st_uid == 65534  # writable by the container's user


async def test_kill_removes_the_container_and_wait_reports_sigkill(tmp_path: Path) -> None:
    client = Client(Container(status=None))
    job = await DockerSandbox(client=client).start(spec_for(tmp_path))
    assert await asyncio.wait_for(job.stdout.readline(), 5) == b"hello\n"
    job.kill()
    job.kill()
    assert await asyncio.wait_for(job.wait(), 5) == -9
    assert client.container.removed.is_set()
    assert await asyncio.wait_for(job.stdout.read(), 5) == b""


LIMITS = JobLimits(
    memory_bytes=512 * 1024 * 1024, cpus=1.5, processes=128, open_files=256, disk_bytes=64 << 20
)


def test_the_jobs_limits_become_the_containers(tmp_path: Path) -> None:
    kwargs = container_kwargs(spec_for(tmp_path, limits=LIMITS), image="i")
    limits = {key: kwargs[key] for key in ("mem_limit", "memswap_limit", "nano_cpus", "pids_limit")}
    assert limits == {
        "mem_limit": 512 * 1024 * 1024,
        "memswap_limit": 512 * 1024 * 1024,  # memory plus swap: no swap at all
        "nano_cpus": 1_500_000_000,
        "pids_limit": 128,
    }
    types_module = pytest.importorskip("docker.types")
    host = types_module.HostConfig(
        version="1.44", ulimits=kwargs["ulimits"], **limits
    )  # what the SDK sends the engine
    assert (host["Memory"], host["MemorySwap"], host["NanoCpus"], host["PidsLimit"]) == (
        512 * 1024 * 1024,
        512 * 1024 * 1024,
        1_500_000_000,
        128,
    )
    assert {(u["Name"], u["Soft"], u["Hard"]) for u in host["Ulimits"]} == {
        ("nofile", 256, 256),
        ("fsize", 64 << 20, 64 << 20),
    }


class OomKilled(Container):
    """Exits as the engine reports a container its cgroup's OOM killer ended."""

    def reload(self) -> None:
        self.attrs = {"State": {"Pid": 4242, "OOMKilled": True}}


async def test_a_container_the_engine_killed_for_memory_names_the_limit(tmp_path: Path) -> None:
    client = Client(OomKilled(status=137))
    job = await DockerSandbox(client=client).start(spec_for(tmp_path, limits=LIMITS))
    await asyncio.wait_for(job.stdout.read(), 5)
    assert await asyncio.wait_for(job.wait(), 5) == -9
    assert job.limit_hit is not None and job.limit_hit.limit == "memory"
    assert "more than its 512 MiB of memory" in job.limit_hit.message


class Listed:
    def __init__(self, job_dir: Path) -> None:
        self.labels = {JOB_LABEL: str(job_dir)}
        self.removed = False

    def remove(self, *, force: bool = False) -> None:
        self.removed = force


class EngineWithLeftovers:
    def __init__(self, containers: list[Listed]) -> None:
        self.containers = self
        self.listed = containers

    def list(self, *, all: bool, filters: dict[str, str]) -> list[Listed]:
        assert all and filters == {"label": JOB_LABEL}
        return self.listed


def test_containers_an_earlier_run_left_are_removed_and_only_this_agents(tmp_path: Path) -> None:
    ours = Listed(tmp_path / "jobs" / "inv_1-1")
    another_agents = Listed(tmp_path / "other-agent" / "jobs" / "inv_2-1")
    sandbox = DockerSandbox(client=EngineWithLeftovers([ours, another_agents]))
    assert sandbox.remove_leftovers(tmp_path / "jobs") == 1
    assert ours.removed and not another_agents.removed


WATCHING_AGENT = """
import asyncio, json, sys
from gpu_share.agent.sandbox.process import SUPERVISOR, lifeline

async def main() -> None:
    config = {"watch": True, "lifeline_fd": lifeline(), "on_agent_exit": sys.argv[1:]}
    watcher = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", str(SUPERVISOR), json.dumps(config), pass_fds=(lifeline(),)
    )
    print(watcher.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_what_the_agent_leaves_to_the_engine_is_removed_when_the_agent_dies(
    tmp_path: Path,
) -> None:
    """The Docker sandbox's watcher: its command runs once the agent is gone, never before."""
    marker = tmp_path / "removed"
    touch = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    agent = subprocess.Popen(
        [sys.executable, "-c", WATCHING_AGENT, *touch], stdout=subprocess.PIPE, text=True
    )
    assert agent.stdout is not None
    watcher = int(await asyncio.to_thread(agent.stdout.readline))
    assert psutil.pid_exists(watcher) and not marker.exists()
    agent.kill()  # kill -9: no goodbye
    agent.wait(10)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert marker.exists()
