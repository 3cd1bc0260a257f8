"""What the node measures of itself (GPUs, CPU, disk), in a child process.

The child (`python -m gpu_share.agent.benchmarks.local`, a `LocalJob` on stdin, the
`LocalResults` on stdout) keeps the CUDA context, the GPU memory a backend caches and
the compute threads out of the agent, and dies with them: a run cut short because work
arrived is a kill, and a driver crash is the child's, not the agent's. It sees the
node's GPUs by UUID in NVML's order, so CUDA device i is `gpus[i]` whatever order
CUDA would have picked.
"""

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field

from gpu_share.agent.benchmarks import compute, storage
from gpu_share.protocol.benchmarks import (
    MAX_ERROR_CHARS,
    CpuMeasurement,
    GpuMeasurement,
    StorageMeasurement,
)
from gpu_share.protocol.nodes import GpuInfo

GpuProbe = Callable[[GpuInfo, int, float], GpuMeasurement]
CpuProbe = Callable[[float, int], CpuMeasurement]
StorageProbe = Callable[[Path, int], StorageMeasurement]

CHILD_START_SEC = 120.0  # importing onnxruntime or PyTorch and creating a CUDA context
PER_GPU_SEC = 120.0


class LocalJob(BaseModel):
    gpus: list[GpuInfo] = Field(default_factory=list)
    scratch_dir: Path
    budget_sec: float = Field(default=1.0, gt=0, description="Time spent timing each figure")
    storage_bytes: int = Field(default=storage.STORAGE_BYTES, gt=0)
    cores: int = Field(default=1, ge=1)


class LocalResults(BaseModel):
    gpus: list[GpuMeasurement] = Field(default_factory=list)
    cpu: CpuMeasurement | None = None
    storage: StorageMeasurement | None = None
    errors: list[str] = Field(default_factory=list)


def _problem(what: str, exc: BaseException) -> str:
    return f"{what}: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def measure_local(
    job: LocalJob,
    *,
    gpu_probe: GpuProbe = compute.measure_gpu,
    cpu_probe: CpuProbe = compute.measure_cpu,
    storage_probe: StorageProbe = storage.measure_storage,
) -> LocalResults:
    """Each GPU in turn, then the CPU, then the disk; a part that fails is an error line."""
    results = LocalResults()
    for ordinal, gpu in enumerate(job.gpus):
        try:
            results.gpus.append(gpu_probe(gpu, ordinal, job.budget_sec))
        except Exception as exc:
            results.gpus.append(
                GpuMeasurement(
                    index=gpu.index, uuid=gpu.uuid, model=gpu.model, error=_problem("GPU", exc)
                )
            )
    try:
        results.cpu = cpu_probe(job.budget_sec, job.cores)
    except Exception as exc:
        results.errors.append(_problem("CPU", exc))
    try:
        results.storage = storage_probe(job.scratch_dir, job.storage_bytes)
    except Exception as exc:
        results.errors.append(_problem("storage", exc))
    return results


class LocalMeasurer(Protocol):
    async def measure(self, job: LocalJob) -> LocalResults: ...


class InThread:
    """Measures in a thread of this process, with the probes given (tests; a simulated GPU)."""

    def __init__(
        self,
        *,
        gpu_probe: GpuProbe = compute.measure_gpu,
        cpu_probe: CpuProbe = compute.measure_cpu,
        storage_probe: StorageProbe = storage.measure_storage,
    ) -> None:
        self.gpu_probe = gpu_probe
        self.cpu_probe = cpu_probe
        self.storage_probe = storage_probe

    async def measure(self, job: LocalJob) -> LocalResults:
        return await asyncio.to_thread(
            measure_local,
            job,
            gpu_probe=self.gpu_probe,
            cpu_probe=self.cpu_probe,
            storage_probe=self.storage_probe,
        )


class ChildFailed(Exception):
    """The measuring child process died or said nothing usable."""


class InChildProcess:
    """Measures in a child process of the same Python; cancelling the call kills it."""

    async def measure(self, job: LocalJob) -> LocalResults:
        threads = str(job.cores)
        env = {
            **os.environ,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(gpu.uuid for gpu in job.gpus),
            "OPENBLAS_NUM_THREADS": threads,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",
        }
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpu_share.agent.benchmarks.local",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            async with asyncio.timeout(CHILD_START_SEC + PER_GPU_SEC * len(job.gpus)):
                out, err = await child.communicate(job.model_dump_json().encode())
        finally:
            if child.returncode is None:  # cancelled (work arrived) or timed out
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                await child.wait()
        if child.returncode != 0:
            tail = err.decode(errors="replace").strip()[-500:]
            raise ChildFailed(f"the measuring process exited with {child.returncode}: {tail}")
        try:
            return LocalResults.model_validate_json(out)
        except ValueError as exc:
            raise ChildFailed(f"the measuring process said nothing usable: {exc}") from exc


def main() -> None:
    job = LocalJob.model_validate_json(sys.stdin.buffer.read())
    answer = os.dup(1)
    os.dup2(2, 1)  # whatever a library prints goes to stderr; stdout carries the results
    results = measure_local(job)
    with os.fdopen(answer, "w") as out:
        out.write(results.model_dump_json())


if __name__ == "__main__":
    main()
