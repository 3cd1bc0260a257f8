"""The GPU models the platform supports, with datasheet figures (dense, no sparsity).

Applications name a model from here (or "other"); benchmarks score a GPU against its
model's figures. Sources: NVIDIA's datasheets for each product (SXM variants where a
model has several).
"""

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

BY_ID = {model.id: model for model in SUPPORTED}


def is_known(model_id: str) -> bool:
    return model_id in BY_ID or model_id == OTHER_MODEL


def display_name(model_id: str, other: str | None = None) -> str:
    if model_id == OTHER_MODEL:
        return f"{other} (other)"
    model = BY_ID.get(model_id)
    return model.name if model else model_id
