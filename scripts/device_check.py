"""What a GPU machine looks like to the agent: run it there (`python scripts/device_check.py`).

Prints NVML discovery and one telemetry reading, then the runtimes the agent would
advertise (a `*_cuda` runtime only if its probe really ran on the GPU). Then it measures
each GPU once through every backend that reaches it, in the agent's order (onnxruntime's
CUDA provider, which every install has, then PyTorch, then CuPy), each figure next to
the datasheet's (`gpu_catalog`) and labelled with the backend it came from; and the CPU
through onnxruntime and numpy, next to `gpu_catalog.CPU_BASELINE`.

Exits 1 if NVML lists no GPU, 2 if it lists GPUs that onnxruntime's CUDA provider
cannot measure (a default install would leave them unscored). Needs nvidia-ml-py,
psutil and pydantic; onnxruntime, onnx, PyTorch, CuPy and CatBoost are used when present.
"""

import argparse
import json
import os
import sys

from gpu_share.agent.benchmarks import compute
from gpu_share.agent.capabilities import detect_runtimes
from gpu_share.agent.gpu import Nvml, telemetry
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.protocol.benchmarks import CpuMeasurement, GpuMeasurement, Precision
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.provider_applications import GpuModelInfo

NO_GPU = 1
NO_ONNXRUNTIME_CUDA = 2
ROW = "  {figure:<20} {measured:>10} {datasheet:>10} {ratio:>6}  {backend}"


def _row(figure: str, measured: float | None, datasheet: float | None, backend: str) -> str:
    ratio = f"{measured / datasheet:.0%}" if measured is not None and datasheet else "-"
    return ROW.format(
        figure=figure,
        measured="-" if measured is None else f"{measured:.1f}",
        datasheet="-" if datasheet is None else f"{datasheet:.1f}",
        ratio=ratio,
        backend=backend,
    )


def print_gpu(measured: GpuMeasurement, reference: GpuModelInfo | None) -> None:
    backend = measured.backend or "?"
    for precision in Precision:
        datasheet = getattr(reference, f"{precision.value}_tflops", None)
        print(_row(f"{precision.value} TFLOP/s", measured.tflops(precision), datasheet, backend))
    datasheet = reference.memory_bandwidth_gbs if reference else None
    print(_row("copy GB/s (r+w)", measured.memory_bandwidth_gbs, datasheet, backend))
    if measured.error:
        print(f"  {backend} errors: {measured.error}")


def print_cpu(measured: CpuMeasurement) -> None:
    baseline = gpu_catalog.CPU_BASELINE
    backend = measured.backend or "?"
    print(
        _row(
            f"matmul GFLOP/s ({measured.cores}c)",
            measured.matmul_gflops,
            baseline.matmul_gflops_per_core * measured.cores,
            backend,
        )
    )
    print(
        _row(
            "copy GB/s (1 core)",
            measured.memory_bandwidth_gbs,
            baseline.memory_bandwidth_gbs,
            backend,
        )
    )


def measure_gpu(ordinal: int, info: GpuInfo, budget_sec: float) -> bool:
    """`info` through each backend that reaches it; True if onnxruntime's CUDA provider
    measured at least its FP32 multiply and its copy."""
    reference = gpu_catalog.match(info.model, info.vram_mb)
    print(
        f"\nGPU {info.index} (CUDA {ordinal}): {info.model}, compute capability "
        f"{info.compute_capability}; datasheet: {reference.name if reference else 'none'}"
    )
    print(
        ROW.format(
            figure="figure",
            measured="measured",
            datasheet="datasheet",
            ratio="ratio",
            backend="backend",
        )
    )
    onnxruntime_measured = False
    for name, open_backend in compute.gpu_backends(ordinal, info.compute_capability):
        try:
            device = open_backend()
        except Exception as exc:
            print(f"  {name}: not used: {exc}")
            continue
        measured = compute.measure_gpu_on(device, info, budget_sec)
        print_gpu(measured, reference)
        if name == "onnxruntime" and None not in (
            measured.fp32_tflops,
            measured.memory_bandwidth_gbs,
        ):
            onnxruntime_measured = True
    return onnxruntime_measured


def measure_cpu(budget_sec: float) -> None:
    cores = compute.available_cores()
    print(f"\nCPU: {cores} cores; baseline: {gpu_catalog.CPU_BASELINE.name}")
    devices = [compute.open_cpu(cores)]
    if not isinstance(devices[0], compute.NumpyDevice):
        devices.append(compute.NumpyDevice())
    for device in devices:
        print_cpu(compute.measure_cpu_on(device, cores, budget_sec))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=1.0, help="seconds timed per figure")
    args = parser.parse_args()
    nvml = Nvml()
    gpus = nvml.discover()
    print(json.dumps([g.info.model_dump() for g in gpus], indent=2))
    print(telemetry(nvml, gpus).model_dump_json(indent=2))
    runtimes = detect_runtimes(gpus)
    print("runtimes:", ", ".join(r.value for r in runtimes))
    nvml.shutdown()
    # CUDA device i is NVML's GPU i, as in the agent's measuring process (benchmarks.local).
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(g.info.uuid for g in gpus)
    by_onnxruntime = [measure_gpu(i, gpu.info, args.budget) for i, gpu in enumerate(gpus)]
    measure_cpu(args.budget)
    if not gpus:
        return NO_GPU
    if not all(by_onnxruntime):
        print(
            "\nonnxruntime's CUDA provider could not measure every GPU: a default install "
            "would leave them unscored (pip install onnxruntime-gpu)"
        )
        return NO_ONNXRUNTIME_CUDA
    return 0


if __name__ == "__main__":
    sys.exit(main())
