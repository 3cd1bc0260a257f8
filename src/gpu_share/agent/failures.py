"""Why a job failed, in words for the tenant; raised inside the agent, reported as `error`.

The limit messages are here, and nothing heavier than the error codes, because both
sides say them: the agent when it sees a job killed at a limit, and the runtime
inside the sandbox when an allocation or a write is refused. Each names the limit and
its size, so the tenant knows what to shrink.
"""

from gpu_share.protocol.errors import ErrorCode

MiB = 1024 * 1024
_PROVIDER = "the limit this provider sets per job"


class JobFailed(Exception):
    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message


def mib(size: int) -> str:
    return f"{size / MiB:.0f} MiB" if size >= MiB else f"{size} bytes"


def memory_exceeded(limit: int) -> str:
    return (
        f"the job used more than its {mib(limit)} of memory ({_PROVIDER}); "
        "use smaller inputs or batches, or a node with larger jobs"
    )


def disk_exceeded(limit: int) -> str:
    return (
        f"the job wrote more than its {mib(limit)} of disk in its folder ({_PROVIDER}); "
        "ask for fewer or smaller outputs"
    )


def processes_exceeded(limit: int) -> str:
    return f"the job tried to run more than {limit} processes and threads ({_PROVIDER})"


def open_files_exceeded(limit: int) -> str:
    return f"the job tried to hold more than {limit} files open at once ({_PROVIDER})"


def cpu_time_exceeded(seconds: int, cpus: float) -> str:
    return (
        f"the job used more than its {seconds} CPU-seconds ({cpus:g} CPUs for the whole of "
        f"its timeout_sec; {_PROVIDER})"
    )


def inputs_too_large(size: int, limit: int) -> str:
    return (
        f"the inputs NPZ expands to {mib(size)}, more than this job's {mib(limit)} of "
        f"memory ({_PROVIDER}); send smaller arrays or fewer rows per invoke"
    )
