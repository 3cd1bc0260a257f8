"""A runtime started before its job: `python -m gpu_share.agent.runtimes.onnx --warm`.

The agent starts it in a fresh sandbox (`gpu_share.agent.warm`) whose folder holds
only the FIFO `go`. Having imported numpy and onnxruntime — most of what a runtime's
start costs — it blocks reading `go`. The agent puts the job's files in the folder and
writes one line of JSON: the runtime's arguments and the rlimits that depend on the
job (its CPU-time budget), which the process lowers itself to before it reads anything
of the job. From there it runs that one job as a cold runtime would, and exits: a warm
process never serves a second job.
"""

import json
import os
import resource
import sys
from typing import NoReturn

WARM_FLAG = "--warm"
GO_FIFO = "go"
READY_LINE = "gpu-share: warm runtime ready"
"""Printed once the runtime is imported (and the sandbox furnished): the agent's sign
that it may move the folder and hand over a job. Lines before it are the start's, not
a job's."""
MAX_ORDER_BYTES = 64 * 1024


def lower_rlimit(name: str, soft: int, hard: int) -> None:
    """Never above what the process has (lowering is all an unprivileged process may do)."""
    kind = getattr(resource, name)
    _, current = resource.getrlimit(kind)
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(kind, (soft, hard))


def wait_for_job() -> list[str] | None:
    """Block until the agent hands over a job; its runtime arguments, with the job's
    rlimits applied. None: the agent let this process go unused."""
    print(READY_LINE, flush=True)
    with open(GO_FIFO, "rb") as go:
        order = go.readline(MAX_ORDER_BYTES)
    os.unlink(GO_FIFO)  # the job's folder then holds what a cold job's holds
    if not order.strip():
        return None
    message = json.loads(order)
    for name, (soft, hard) in message.get("rlimits", {}).items():
        lower_rlimit(name, int(soft), int(hard))
    return [str(arg) for arg in message["argv"]]


def exit_now(status: int) -> NoReturn:
    """The verdict and the outputs are written and closed: skip the interpreter's
    teardown, which with onnxruntime loaded costs 20–70 ms, several times the job."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
