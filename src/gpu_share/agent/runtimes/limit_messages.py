"""The limit messages, in words for the tenant, with nothing imported.

Both sides say them: the agent when it sees a job killed at a limit
(`gpu_share.agent.failures`), and the runtime inside the sandbox when an allocation
or a write is refused. They live here, in the runtimes package, because the runtime
process starts once per job and must not pay for the agent's imports to say them.
Each names the limit and its size, so the tenant knows what to shrink.
"""

MiB = 1024 * 1024
_PROVIDER = "the limit this provider sets per job"


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


def inputs_past_cap(size: int, cap: int) -> str:
    return (
        f"the inputs NPZ expands to {mib(size)}, more than the {mib(cap)} this node lets any "
        f"job's inputs expand to (MAX_INPUTS_EXPANDED_BYTES, {_PROVIDER}); send smaller "
        "arrays or fewer rows per invoke"
    )
