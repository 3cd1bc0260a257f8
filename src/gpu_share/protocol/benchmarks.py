"""Benchmarks (SPEC §3.3): what an agent measures of its node, and the verdict on it.

    POST /v1/agent/benchmarks                 (node key) a `BenchmarkReport` → `BenchmarkRun`
    GET  /v1/agent/benchmarks/ping            (node key) a tiny answer: the round trip
    GET  /v1/agent/benchmarks/download?bytes=N  (node key) N zero bytes: download throughput
    POST /v1/agent/benchmarks/upload          (node key) read and dropped: upload throughput
    POST /v1/admin/nodes/{node_id}/benchmark  (admin) ask the node to benchmark itself
    GET  /v1/provider/nodes/{node_id}/benchmarks  (provider) the node's runs, newest first
    GET  /v1/nodes/{node_id}/benchmarks       (tenant or admin) the node's latest run

Every number an agent sends is finite and bounded: a report is its word about its own
machine, and a NaN, a negative or an absurd figure is refused (422) rather than scored.
How a run is scored is docs/benchmarks.md.
"""

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Self

from pydantic import AwareDatetime, BaseModel, Field, model_validator

from gpu_share.protocol.nodes import MAX_GPUS

MAX_ERRORS = 32
MAX_ERROR_CHARS = 1000
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024  # what one download probe may ask for
MAX_UPLOAD_BYTES = 64 * 1024 * 1024  # what one upload probe may send


def _bounded(top: float, description: str) -> object:
    return Field(ge=0, le=top, allow_inf_nan=False, description=description)


# Far above any machine that exists, so only nonsense is refused.
Tflops = Annotated[float | None, _bounded(100_000.0, "Dense matrix multiply, TFLOP/s")]
Gflops = Annotated[float | None, _bounded(100_000_000.0, "Dense matrix multiply, GFLOP/s")]
GBps = Annotated[float | None, _bounded(1_000_000.0, "Bytes read + written per second, GB/s")]
MBps = Annotated[float | None, _bounded(10_000_000.0, "MB/s (10^6 bytes per second)")]
Mbps = Annotated[float | None, _bounded(100_000_000.0, "Mbit/s (10^6 bits per second)")]
ErrorText = Annotated[str, Field(max_length=MAX_ERROR_CHARS)]


class BenchmarkTrigger(StrEnum):
    FIRST = "first"  # the node's first run, after it registered
    PERIODIC = "periodic"  # every `benchmark_interval_hours` (24 by default)
    REQUESTED = "requested"  # an admin asked (`POST /v1/admin/nodes/{id}/benchmark`)


class Precision(StrEnum):
    FP32 = "fp32"  # IEEE single precision on CUDA cores (TF32 off)
    FP16 = "fp16"  # half precision on tensor cores
    BF16 = "bf16"  # bfloat16 on tensor cores
    TF32 = "tf32"  # float32 inputs through tensor cores


class GpuMeasurement(BaseModel):
    """One GPU, keyed as NVML names it; a figure the node could not measure is null."""

    index: int = Field(ge=0, le=MAX_GPUS)
    uuid: str = Field(min_length=1, max_length=100)
    model: str = Field(max_length=200, description="As NVML reports it")
    backend: str | None = Field(default=None, max_length=100, description="e.g. torch 2.4.0")
    fp32_tflops: Tflops = None
    fp16_tflops: Tflops = None
    bf16_tflops: Tflops = None
    tf32_tflops: Tflops = None
    memory_bandwidth_gbs: GBps = None  # a device-to-device copy
    error: ErrorText | None = Field(default=None, description="Why figures are missing")

    def tflops(self, precision: Precision) -> float | None:
        value: float | None = getattr(self, f"{precision.value}_tflops")
        return value


class CpuMeasurement(BaseModel):
    """The CPU equivalents: a matrix multiply on every core (onnxruntime's CPU provider,
    else numpy), one core's memory copy."""

    cores: int = Field(ge=1, le=4096, description="Cores the measurement could use")
    backend: str | None = Field(default=None, max_length=100)
    matmul_gflops: Gflops = None  # float32, over all the cores
    memory_bandwidth_gbs: GBps = None  # one core's copy


class NetworkMeasurement(BaseModel):
    """To the coordinator, over the agent's own connection."""

    rtt_ms: float | None = Field(
        default=None, ge=0, le=600_000, allow_inf_nan=False, description="Median round trip"
    )
    download_mbps: Mbps = None
    upload_mbps: Mbps = None


class StorageMeasurement(BaseModel):
    """A file in the agent's data folder: written and synced, then read back from disk."""

    write_mbps: MBps = None
    read_mbps: MBps = None


class BenchmarkReport(BaseModel):
    """What the agent measured in one run of the suite."""

    trigger: BenchmarkTrigger
    started_at: AwareDatetime
    duration_ms: int = Field(ge=0, le=24 * 3600 * 1000)
    gpus: list[GpuMeasurement] = Field(default_factory=list, max_length=MAX_GPUS)
    cpu: CpuMeasurement | None = None
    network: NetworkMeasurement | None = None
    storage: StorageMeasurement | None = None
    errors: list[ErrorText] = Field(default_factory=list, max_length=MAX_ERRORS)

    @model_validator(mode="after")
    def _one_measurement_per_gpu(self) -> Self:
        uuids = [gpu.uuid for gpu in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError("each GPU may be measured once per report")
        return self


class Component(BaseModel):
    """One measured figure against its reference: score = min(1, measured / reference)
    (for a round trip, where less is better: min(1, reference / measured))."""

    measured: float
    reference: float | None = Field(description="Null where there is no reference to compare")
    unit: str
    score: float | None
    counts: bool = Field(
        default=True, description="Part of the score and the thresholds; false: shown only"
    )


class Verdict(BaseModel):
    score: float | None = Field(description="0..1: the weighted fraction of the reference")
    passed: bool | None = Field(description="Null when nothing could be scored")
    reason: str | None = Field(default=None, description="What failed, and by how much")
    components: dict[str, Component] = Field(default_factory=dict)


class GpuVerdict(Verdict):
    index: int
    uuid: str
    model: str = Field(description="As the node reported it")
    reference_model: str | None = Field(
        default=None, description="The catalog model the figures are compared with"
    )
    performs_like: str | None = Field(
        default=None, description="The catalog model it measured like, when not its own"
    )
    error: str | None = None


class BenchmarkRun(BaseModel):
    """One run of a node's suite as the platform scored it."""

    id: str
    node_id: str
    trigger: BenchmarkTrigger
    started_at: datetime
    finished_at: datetime
    passed: bool = Field(description="Every GPU (on a CPU node: the node) scored passed")
    reason: str | None = None
    tier: str = Field(description="The thresholds it was held to: enterprise or community")
    gpus: list[GpuVerdict]
    node: Verdict = Field(description="The CPU, storage and network: the node as a whole")
    errors: list[str] = Field(default_factory=list)


class NodeBenchmark(BaseModel):
    """What tenants see: a node's latest run, if any."""

    node_id: str
    latest: BenchmarkRun | None


class BenchmarkRequested(BaseModel):
    node_id: str
    requested_at: datetime = Field(description="The node runs the suite when next idle")


class ProbeUpload(BaseModel):
    received_bytes: int
