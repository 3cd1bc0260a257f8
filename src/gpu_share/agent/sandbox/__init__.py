"""How the agent isolates one job's process: Docker, bubblewrap, or (unisolated) a plain process.

Every sandbox shows the job the same world: its folder as working directory and only
writable place, its inputs read-only at `./in/<name>`, a clean environment, only its
assigned GPUs, and its limits (`limits.py`); and every one ends the job with the agent.
`detect_sandbox()` picks the strongest one this machine has.
"""

from __future__ import annotations

import logging

from gpu_share.agent.sandbox.base import (
    INPUTS_DIR,
    INSIDE_JOB_DIR,
    Sandbox,
    SandboxedProcess,
    SandboxError,
    SandboxSpec,
    SandboxUnavailable,
)
from gpu_share.agent.sandbox.bwrap import BwrapSandbox, detect_bwrap
from gpu_share.agent.sandbox.docker import DockerSandbox, connect_docker
from gpu_share.agent.sandbox.limits import JobLimits, LimitedSandbox, LimitHit
from gpu_share.agent.sandbox.process import ProcessSandbox

__all__ = [
    "INPUTS_DIR",
    "INSIDE_JOB_DIR",
    "BwrapSandbox",
    "DockerSandbox",
    "JobLimits",
    "LimitHit",
    "LimitedSandbox",
    "ProcessSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "SandboxUnavailable",
    "SandboxedProcess",
    "detect_sandbox",
]

logger = logging.getLogger(__name__)


def detect_sandbox(preference: str = "auto", *, docker_image: str | None = None) -> Sandbox:
    """The sandbox jobs run in: the one named, or with "auto" the strongest that works here.

    "auto" takes Docker when an engine answers, can hand out this machine's GPUs and has
    the runtime image; else bubblewrap when it runs a probe job; else the unisolated
    process sandbox, with a warning. A named one that cannot work raises
    SandboxUnavailable, whose message says how to install it.
    """
    if preference == "docker":
        return connect_docker(docker_image)
    if preference == "bwrap":
        return detect_bwrap()
    if preference == "process":
        logger.warning("sandbox: process (chosen): jobs are NOT isolated from this machine")
        return ProcessSandbox()
    if preference != "auto":
        raise ValueError(f"unknown sandbox {preference!r}: auto, docker, bwrap or process")

    try:
        docker = connect_docker(docker_image)
    except SandboxUnavailable as exc:
        logger.info("sandbox: not docker: %s", exc)
    else:
        logger.info("sandbox: docker (image %s)", docker.image)
        return docker
    try:
        sandbox: Sandbox = detect_bwrap()
    except SandboxUnavailable as exc:
        logger.warning(
            "sandbox: process: jobs are NOT isolated from this machine, other jobs or the "
            "agent's files, because neither Docker nor bubblewrap works here (%s)",
            exc,
        )
        return ProcessSandbox()
    logger.info("sandbox: bwrap")
    return sandbox
