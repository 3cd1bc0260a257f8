"""Docker: each job in a throwaway container of the runtime image, with only its assigned GPUs.

Spoken through the Docker SDK for Python (`pip install docker`), imported only when a
Docker sandbox is asked for. The container has no network, a read-only root, a private
`/tmp`, no capabilities, no privilege escalation, uid 65534, the job folder at `/job`
and its inputs read-only at `/job/in/<name>`; GPUs come through a device request naming
the assigned UUIDs, which the NVIDIA container toolkit honours. The job's limits become
the container's: memory (no swap), CPUs, processes, open files and file size; the
agent watches the job folder's size as for the other sandboxes.

A container belongs to the engine, not to the agent, so it would outlive an agent
killed with `kill -9`: a watcher process (`supervisor.py` in watch mode) removes it
when the agent dies, and an agent that comes back removes any container left with its
jobs folder in the `dev.gpu-share.job` label (`remove_leftovers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpu_share._version import __version__
from gpu_share.agent import failures
from gpu_share.agent.sandbox.base import (
    INPUTS_DIR,
    INSIDE_JOB_DIR,
    NOBODY,
    PRIVATE_TMP,
    MiB,
    SandboxError,
    SandboxSpec,
    SandboxUnavailable,
    check_spec,
    job_environment,
    nvidia_minor_numbers,
    status_from_wrapper,
)
from gpu_share.agent.sandbox.limits import DiskWatch, JobLimits, LimitHit, watch_disk
from gpu_share.agent.sandbox.process import STREAM_LIMIT, SUPERVISOR, lifeline

logger = logging.getLogger(__name__)

DEFAULT_IMAGE = f"gpu-share:{__version__}"
"""The runtime image: gpu_share with its runtimes installed, `python` on its PATH."""

JOB_LABEL = "dev.gpu-share.job"
"""Marks the agent's containers, so leftovers of a crashed agent can be found and removed."""

SDK_HINT = "install the Docker SDK for Python (`pip install docker`)"
ENGINE_HINT = (
    "install Docker Engine (https://docs.docker.com/engine/install/) and start it, and make "
    "sure the agent can reach its socket (DOCKER_HOST, or /var/run/docker.sock)"
)
NVIDIA_HINT = (
    "this machine has NVIDIA GPUs but Docker has no NVIDIA runtime: install the NVIDIA "
    "Container Toolkit (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/) "
    "and run `nvidia-ctk runtime configure --runtime=docker`, then restart Docker"
)

T = TypeVar("T")


def container_kwargs(
    spec: SandboxSpec,
    *,
    image: str,
    python: str = "python",
    pids_limit: int = 1024,
    tmp_size_bytes: int = 1024 * MiB,
) -> dict[str, Any]:
    """Keyword arguments for `client.containers.create()` running `spec`.

    `argv[0]` naming the agent's own interpreter is replaced by `python`: the host's
    path means nothing in the image. PATH is left to the image unless the job sets it.
    """
    check_spec(spec)
    argv = list(spec.argv)
    if argv[0] == sys.executable:
        argv[0] = python
    environment = job_environment(spec, home=INSIDE_JOB_DIR)
    if "PATH" not in spec.env:
        del environment["PATH"]
    mounts = [_bind(spec.job_dir.resolve(), INSIDE_JOB_DIR, read_only=False)]
    mounts += [
        _bind(Path(path).resolve(), f"{INSIDE_JOB_DIR}/{INPUTS_DIR}/{name}", read_only=True)
        for name, path in spec.inputs.items()
    ]
    kwargs: dict[str, Any] = {
        "image": image,
        "command": argv,
        "working_dir": INSIDE_JOB_DIR,
        "environment": environment,
        "user": f"{NOBODY}:{NOBODY}",
        "hostname": "gpu-share-job",
        "labels": {JOB_LABEL: str(spec.job_dir.resolve())},
        "network_disabled": True,
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {PRIVATE_TMP: f"rw,nosuid,nodev,size={tmp_size_bytes}"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": pids_limit,
        "init": True,
        "mounts": mounts,
        "stdin_open": False,
        "tty": False,
    }
    if spec.gpu_uuids:
        # The SDK turns this dict into DeviceRequest(device_ids=…, capabilities=[["gpu"]]).
        kwargs["device_requests"] = [
            {"device_ids": list(spec.gpu_uuids), "capabilities": [["gpu"]]}
        ]
    kwargs.update(_limit_kwargs(spec.limits))
    return kwargs


def _limit_kwargs(limits: JobLimits | None) -> dict[str, Any]:
    """The job's limits as the engine takes them (a cgroup of the container's own)."""
    if limits is None:
        return {}
    kwargs: dict[str, Any] = {}
    if limits.memory_bytes is not None:
        kwargs["mem_limit"] = limits.memory_bytes
        kwargs["memswap_limit"] = limits.memory_bytes  # memory plus swap: no swap
    if limits.cpus is not None:
        kwargs["nano_cpus"] = round(limits.cpus * 1e9)
    if limits.processes is not None:
        kwargs["pids_limit"] = limits.processes
    ulimits = []
    if limits.open_files is not None:
        ulimits.append({"Name": "nofile", "Soft": limits.open_files, "Hard": limits.open_files})
    if limits.disk_bytes is not None:
        ulimits.append({"Name": "fsize", "Soft": limits.disk_bytes, "Hard": limits.disk_bytes})
    if ulimits:
        kwargs["ulimits"] = ulimits
    return kwargs


def _bind(source: Path, target: str, *, read_only: bool) -> dict[str, Any]:
    # The Engine API's own Mount shape: the SDK passes it through, and a Source may repeat
    # (one cached file under two names), which `volumes={source: …}` could not express.
    return {"Type": "bind", "Source": str(source), "Target": target, "ReadOnly": read_only}


class DockerSandbox:
    """Runs each job in a new container; `container_kwargs()` is the whole policy."""

    name = "docker"
    isolated = True

    def __init__(
        self,
        *,
        client: Any,
        image: str = DEFAULT_IMAGE,
        python: str = "python",
        pids_limit: int = 1024,
        tmp_size_bytes: int = 1024 * MiB,
    ) -> None:
        """`client` is a `docker.DockerClient`; `connect_docker()` makes one and checks it."""
        self.client = client
        self.image = image
        self.python = python
        self.pids_limit = pids_limit
        self.tmp_size_bytes = tmp_size_bytes

    def container_kwargs(self, spec: SandboxSpec) -> dict[str, Any]:
        return container_kwargs(
            spec,
            image=self.image,
            python=self.python,
            pids_limit=self.pids_limit,
            tmp_size_bytes=self.tmp_size_bytes,
        )

    async def start(self, spec: SandboxSpec) -> DockerJob:
        kwargs = self.container_kwargs(spec)
        if not spec.job_dir.is_dir():
            raise SandboxError(f"job folder {spec.job_dir} does not exist")
        await asyncio.to_thread(_prepare_job_dir, spec.job_dir, bool(spec.inputs))
        disk_limit = spec.limits.disk_bytes if spec.limits is not None else None
        disk = (
            await asyncio.to_thread(DiskWatch, spec.job_dir.resolve(), disk_limit)
            if disk_limit is not None
            else None
        )
        try:
            container = await asyncio.to_thread(self.client.containers.create, **kwargs)
        except Exception as exc:  # the SDK's errors: APIError, ImageNotFound, transport errors
            raise SandboxError(
                f"cannot create a container from {self.image}: {exc} "
                f"(is the image on this machine? `docker pull {self.image}`)"
            ) from exc
        try:
            watcher = await _watch_for_agent_exit(container.id)
        except OSError as exc:
            await asyncio.to_thread(_remove, container)
            raise SandboxError(f"cannot start the container's watcher: {exc}") from exc
        try:
            await asyncio.to_thread(container.start)
            await asyncio.to_thread(container.reload)
        except Exception as exc:
            await asyncio.to_thread(_remove, container)
            _stop_watcher(watcher)
            raise SandboxError(f"cannot start the container: {exc}") from exc
        return DockerJob(container, limits=spec.limits, disk=disk, watcher=watcher)

    def remove_leftovers(self, jobs_dir: Path) -> int:
        """Remove the containers an earlier run of this agent left (killed with -9)."""
        jobs_dir = jobs_dir.resolve()
        removed = 0
        try:
            containers = self.client.containers.list(all=True, filters={"label": JOB_LABEL})
        except Exception:  # the engine went away: nothing to remove now
            logger.warning("could not list leftover job containers", exc_info=True)
            return 0
        for container in containers:
            folder = Path(container.labels.get(JOB_LABEL, "/"))
            if folder.parent == jobs_dir:
                _remove(container)
                removed += 1
        return removed


async def _watch_for_agent_exit(container_id: str) -> asyncio.subprocess.Process:
    """A process that removes the container once the agent is gone, however it went."""
    config = {
        "watch": True,
        "lifeline_fd": lifeline(),
        "on_agent_exit": [sys.executable, "-m", __name__, "remove", container_id],
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        str(SUPERVISOR),
        json.dumps(config),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        pass_fds=(lifeline(),),
    )


def _stop_watcher(watcher: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        watcher.terminate()


def _prepare_job_dir(job_dir: Path, has_inputs: bool) -> None:
    """Let uid 65534, the container's user, write in the job folder: handed over when the
    agent is root, else opened to all (the jobs folder around it must be private)."""
    if has_inputs:
        (job_dir / INPUTS_DIR).mkdir(exist_ok=True)
    paths = [job_dir]
    for root, dirs, files in os.walk(job_dir):
        paths += [Path(root, name) for name in [*dirs, *files]]
    for path in paths:
        if os.geteuid() == 0:
            os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        elif path.is_dir() and not path.is_symlink():
            path.chmod(0o777)


class DockerJob:
    """A running container; its logs (stdout and stderr together) feed `stdout` from a thread."""

    def __init__(
        self,
        container: Any,
        *,
        limits: JobLimits | None = None,
        disk: DiskWatch | None = None,
        watcher: asyncio.subprocess.Process | None = None,
    ) -> None:
        self._container = container
        self.pid: int = int(container.attrs.get("State", {}).get("Pid") or 0)
        self.stdout = asyncio.StreamReader(limit=STREAM_LIMIT)
        self.limit_hit: LimitHit | None = None
        self._limits = limits
        self._disk = disk
        self._watcher = watcher
        self._loop = asyncio.get_running_loop()
        self._killed = False
        self._removal: asyncio.Future[None] | None = None
        self._waiting: asyncio.Future[int] | None = None
        self._logs_done = _in_thread(self._loop, self._pump_logs)
        self._exit = _in_thread(self._loop, self._container.wait)
        self._watching = (
            asyncio.ensure_future(watch_disk(disk, self._disk_full)) if disk is not None else None
        )

    def _disk_full(self, hit: LimitHit) -> None:
        self.limit_hit = hit
        self.kill()

    def _pump_logs(self) -> None:
        try:
            for chunk in self._container.logs(stream=True, follow=True, stdout=True, stderr=True):
                self._call(self.stdout.feed_data, chunk)
        except Exception:  # the container went away mid-stream (killed): the log ends there
            logger.debug("log stream of container %s ended", self._container.id, exc_info=True)
        finally:
            self._call(self.stdout.feed_eof)

    def _call(self, function: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is reading
            self._loop.call_soon_threadsafe(function, *args)

    async def wait(self) -> int:
        if self._waiting is None:
            self._waiting = asyncio.ensure_future(self._wait())
        return await asyncio.shield(self._waiting)

    async def _wait(self) -> int:
        try:
            result = await self._exit
            code = int(result.get("StatusCode", -1))
        except Exception as exc:
            if not self._killed:
                raise SandboxError(f"lost the container: {exc}") from exc
            code = -signal.SIGKILL
        await self._logs_done
        if self._watching is not None:
            self._watching.cancel()
        if self.limit_hit is None and not self._killed:
            self.limit_hit = await asyncio.to_thread(self._judge)
        if self._removal is None:
            self._removal = _in_thread(self._loop, lambda: _remove(self._container))
        await self._removal
        if self._watcher is not None:
            _stop_watcher(self._watcher)
            await self._watcher.wait()
        return -signal.SIGKILL if self._killed else status_from_wrapper(code)

    def _judge(self) -> LimitHit | None:
        """The limit that ended the container: the engine's OOM flag, or the folder's size."""
        limits = self._limits
        if limits is not None and limits.memory_bytes is not None:
            with contextlib.suppress(Exception):
                self._container.reload()
            if self._container.attrs.get("State", {}).get("OOMKilled"):
                return LimitHit("memory", failures.memory_exceeded(limits.memory_bytes))
        return self._disk.exceeded() if self._disk is not None else None

    def kill(self) -> None:
        """Remove the container (killing all it runs) from a thread; `wait()` sees it done."""
        if self._killed:
            return
        self._killed = True
        if self._removal is None:
            self._removal = _in_thread(self._loop, lambda: _remove(self._container))


def _remove(container: Any) -> None:
    try:
        container.remove(force=True)
    except Exception:  # already gone
        logger.debug("removing container %s", getattr(container, "id", "?"), exc_info=True)


def _in_thread(loop: asyncio.AbstractEventLoop, function: Callable[[], T]) -> asyncio.Future[T]:
    """Run a blocking call for as long as it takes on its own thread, not the shared pool,
    which a container's log stream and wait would otherwise hold for the job's whole life."""
    future: asyncio.Future[T] = loop.create_future()

    def succeed(result: T) -> None:
        if not future.done():
            future.set_result(result)

    def fail(error: BaseException) -> None:
        if not future.done():
            future.set_exception(error)

    def run() -> None:
        try:
            result = function()
        except BaseException as exc:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                loop.call_soon_threadsafe(fail, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(succeed, result)

    threading.Thread(target=run, name="gpu-share-docker", daemon=True).start()
    return future


def remove_container(container_id: str) -> None:
    """What the watcher runs once the agent is gone: `python -m …docker remove <id>`."""
    import docker

    with contextlib.suppress(Exception):  # already gone, or the engine with it
        docker.from_env(timeout=30).containers.get(container_id).remove(force=True)


def connect_docker(image: str | None = None) -> DockerSandbox:
    """A Docker sandbox if an engine answers, can give GPUs where this machine has them, and
    has the runtime image; otherwise SandboxUnavailable saying what to install."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxUnavailable(f"no Docker SDK: {SDK_HINT}; {ENGINE_HINT}") from exc
    image = image or DEFAULT_IMAGE
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        info = client.info()
    except Exception as exc:  # DockerException, connection errors: no engine here
        raise SandboxUnavailable(f"no Docker engine answered ({exc}): {ENGINE_HINT}") from exc
    if _host_has_nvidia_gpus() and not _docker_has_nvidia_runtime(info):
        raise SandboxUnavailable(NVIDIA_HINT)
    try:
        client.images.get(image)
    except Exception as exc:
        raise SandboxUnavailable(
            f"the runtime image {image} is not on this machine ({exc}): "
            f"`docker pull {image}`, or build it from the repository's Dockerfile"
        ) from exc
    return DockerSandbox(client=client, image=image)


def _host_has_nvidia_gpus() -> bool:
    return bool(nvidia_minor_numbers()) or any(Path("/dev").glob("nvidia[0-9]*"))


def _docker_has_nvidia_runtime(info: Any) -> bool:
    runtimes = (info.get("Runtimes") or {}) if isinstance(info, dict) else {}
    # Docker answers `--gpus`/device requests through this hook when it is on its PATH.
    return "nvidia" in runtimes or shutil.which("nvidia-container-runtime-hook") is not None


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "remove":
        remove_container(sys.argv[2])
