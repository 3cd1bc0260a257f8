"""Why a job failed, in words for the tenant; raised inside the agent, reported as `error`.

The limit messages live in `runtimes/limit_messages.py` (the runtime inside the sandbox
says them too, and imports nothing) and are re-exported here for the agent.
"""

from gpu_share.agent.runtimes.limit_messages import (
    MiB,
    cpu_time_exceeded,
    disk_exceeded,
    inputs_too_large,
    memory_exceeded,
    mib,
    open_files_exceeded,
    processes_exceeded,
)
from gpu_share.protocol.errors import ErrorCode

__all__ = [
    "JobFailed",
    "MiB",
    "cpu_time_exceeded",
    "disk_exceeded",
    "inputs_too_large",
    "memory_exceeded",
    "mib",
    "open_files_exceeded",
    "processes_exceeded",
]


class JobFailed(Exception):
    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message
