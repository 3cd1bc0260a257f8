"""The GPU models the platform supports, with datasheet figures (dense, no sparsity).

Applications name a model from here (or "other"); benchmarks score a GPU against its
model's figures. Sources: NVIDIA's datasheets for each product (SXM variants where a
model has several). `VARIANTS` adds the PCIe and NVL cards of a supported model, which
NVML names apart and which are slower by design: benchmarks hold each to its own
figures. `match` turns what NVML calls a GPU into one of these; `CPU_BASELINE` is what
a CPU node is compared with (docs/benchmarks.md).
"""

import re
from dataclasses import dataclass

from gpu_share.protocol.provider_applications import OTHER_MODEL, GpuModelInfo

SUPPORTED: tuple[GpuModelInfo, ...] = (
    GpuModelInfo(
        id="h100-80gb",
        name="NVIDIA H100 80GB",
        vram_gb=80,
        fp32_tflops=67.0,
        fp16_tflops=989.4,
        tf32_tflops=494.7,
        bf16_tflops=989.4,
        memory_bandwidth_gbs=3350.0,
    ),
    GpuModelInfo(
        id="h200-141gb",
        name="NVIDIA H200 141GB",
        vram_gb=141,
        fp32_tflops=67.0,
        fp16_tflops=989.4,
        tf32_tflops=494.7,
        bf16_tflops=989.4,
        memory_bandwidth_gbs=4800.0,
    ),
    GpuModelInfo(
        id="a100-40gb",
        name="NVIDIA A100 40GB",
        vram_gb=40,
        fp32_tflops=19.5,
        fp16_tflops=312.0,
        tf32_tflops=156.0,
        bf16_tflops=312.0,
        memory_bandwidth_gbs=1555.0,
    ),
    GpuModelInfo(
        id="a100-80gb",
        name="NVIDIA A100 80GB",
        vram_gb=80,
        fp32_tflops=19.5,
        fp16_tflops=312.0,
        tf32_tflops=156.0,
        bf16_tflops=312.0,
        memory_bandwidth_gbs=2039.0,
    ),
    GpuModelInfo(
        id="l40s-48gb",
        name="NVIDIA L40S 48GB",
        vram_gb=48,
        fp32_tflops=91.6,
        fp16_tflops=362.1,
        tf32_tflops=183.0,
        bf16_tflops=362.1,
        memory_bandwidth_gbs=864.0,
    ),
    GpuModelInfo(
        id="l4-24gb",
        name="NVIDIA L4 24GB",
        vram_gb=24,
        fp32_tflops=30.3,
        fp16_tflops=121.0,
        tf32_tflops=60.0,
        bf16_tflops=121.0,
        memory_bandwidth_gbs=300.0,
    ),
    GpuModelInfo(
        id="rtx-4090-24gb",
        name="NVIDIA GeForce RTX 4090 24GB",
        vram_gb=24,
        fp32_tflops=82.6,
        fp16_tflops=165.2,
        tf32_tflops=82.6,
        bf16_tflops=165.2,
        memory_bandwidth_gbs=1008.0,
    ),
    GpuModelInfo(
        id="rtx-a6000-48gb",
        name="NVIDIA RTX A6000 48GB",
        vram_gb=48,
        fp32_tflops=38.7,
        fp16_tflops=154.8,
        tf32_tflops=77.4,
        bf16_tflops=154.8,
        memory_bandwidth_gbs=768.0,
    ),
)

VARIANTS: tuple[GpuModelInfo, ...] = (
    GpuModelInfo(
        id="h100-pcie-80gb",
        name="NVIDIA H100 PCIe 80GB",
        vram_gb=80,
        fp32_tflops=51.2,
        fp16_tflops=756.0,
        tf32_tflops=378.0,
        bf16_tflops=756.0,
        memory_bandwidth_gbs=2000.0,
    ),
    GpuModelInfo(
        id="h100-nvl-94gb",
        name="NVIDIA H100 NVL 94GB",
        vram_gb=94,
        fp32_tflops=60.0,
        fp16_tflops=835.0,
        tf32_tflops=417.5,
        bf16_tflops=835.0,
        memory_bandwidth_gbs=3900.0,
    ),
    GpuModelInfo(
        id="h200-nvl-141gb",
        name="NVIDIA H200 NVL 141GB",
        vram_gb=141,
        fp32_tflops=60.0,
        fp16_tflops=835.0,
        tf32_tflops=417.5,
        bf16_tflops=835.0,
        memory_bandwidth_gbs=4800.0,
    ),
    GpuModelInfo(
        id="a100-pcie-80gb",
        name="NVIDIA A100 PCIe 80GB",
        vram_gb=80,
        fp32_tflops=19.5,
        fp16_tflops=312.0,
        tf32_tflops=156.0,
        bf16_tflops=312.0,
        memory_bandwidth_gbs=1935.0,
    ),
)

BY_ID = {model.id: model for model in SUPPORTED}
REFERENCES = {model.id: model for model in (*SUPPORTED, *VARIANTS)}
# The supported model each variant is applied for as (an application names only those).
VARIANT_OF = {
    "h100-pcie-80gb": "h100-80gb",
    "h100-nvl-94gb": "h100-80gb",
    "h200-nvl-141gb": "h200-141gb",
    "a100-pcie-80gb": "a100-80gb",
}

# What NVML calls each card (nvmlDeviceGetName), first match wins; e.g. "NVIDIA H100 80GB
# HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090". Names
# not here (an L40, an RTX 4090 D, a laptop part) have no reference figures.
_NVML_NAMES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), model_id)
    for pattern, model_id in (
        (r"\bH100\b.*\bPCIe\b", "h100-pcie-80gb"),
        (r"\bH100\b.*\bNVL\b", "h100-nvl-94gb"),
        (r"\bH100\b(?!.*\b(PCIe|NVL)\b)", "h100-80gb"),
        (r"\bH200\b.*\bNVL\b", "h200-nvl-141gb"),
        (r"\bH200\b", "h200-141gb"),
        (r"\bA100\b.*\b80GB\b.*\bPCIe\b|\bA100-PCIE-80GB\b", "a100-pcie-80gb"),
        (r"\bA100\b.*\b80GB\b", "a100-80gb"),
        (r"\bA100\b.*\b40GB\b", "a100-40gb"),
        (r"\bL40S\b", "l40s-48gb"),
        (r"\bL4\b", "l4-24gb"),
        (r"\bRTX 4090\b(?!\s*(D\b|Laptop))", "rtx-4090-24gb"),
        (r"\bRTX A6000\b", "rtx-a6000-48gb"),
    )
)
A100_80GB_MIN_MB = 50_000  # an A100 whose name gives no size: its memory tells


def match(nvml_name: str, vram_mb: int = 0) -> GpuModelInfo | None:
    """The reference figures for the card NVML names; None for a card not in the table."""
    for pattern, model_id in _NVML_NAMES:
        if pattern.search(nvml_name):
            return REFERENCES[model_id]
    if re.search(r"\bA100\b", nvml_name, re.IGNORECASE):
        return REFERENCES["a100-80gb" if vram_mb >= A100_80GB_MIN_MB else "a100-40gb"]
    return None


@dataclass(frozen=True)
class CpuBaseline:
    """A CPU node's reference: one AVX2 server core at about 2.5 GHz (80 GFLOP/s float32
    peak, 64 in numpy's multiply), and one core's copy of 10 GB/s (read + write)."""

    name: str = "one AVX2 server core at ~2.5 GHz"
    matmul_gflops_per_core: float = 64.0
    memory_bandwidth_gbs: float = 10.0


CPU_BASELINE = CpuBaseline()


def as_applied(name: str) -> str:
    """The name of the supported model an application would give for the catalog model
    named `name` (a variant's base model; any other name as it is)."""
    model = next((m for m in REFERENCES.values() if m.name == name), None)
    if model is None:
        return name
    return BY_ID[VARIANT_OF.get(model.id, model.id)].name


def is_known(model_id: str) -> bool:
    return model_id in BY_ID or model_id == OTHER_MODEL


def display_name(model_id: str, other: str | None = None) -> str:
    if model_id == OTHER_MODEL:
        return f"{other} (other)"
    model = REFERENCES.get(model_id)
    return model.name if model else model_id
