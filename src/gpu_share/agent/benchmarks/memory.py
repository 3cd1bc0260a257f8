"""Memory bandwidth: one buffer copied into another, on a GPU or in the CPU's RAM.

A copy of N bytes reads N and writes N, so the figure is 2 N per second (the way
datasheets count a device's bandwidth). On the CPU the copy runs on one core: the
figure is what one core gets, which is what a job's single-threaded steps see.
"""

from gpu_share.agent.benchmarks.compute import Device, rate

MiB = 1024 * 1024
GPU_COPY_BYTES = 1024 * MiB  # 2 GiB moved per copy: far past any cache
CPU_COPY_BYTES = 128 * MiB  # past the last-level cache of any CPU


def copy_bandwidth_gbs(device: Device, nbytes: int, budget_sec: float) -> float:
    operation = device.copy(nbytes)
    return rate(device, operation, budget_sec) * 2 * nbytes / 1e9


def gpu_copy_bytes(vram_mb: int) -> int:
    """1 GiB, or a sixteenth of a small GPU's memory."""
    return max(16 * MiB, min(GPU_COPY_BYTES, vram_mb * MiB // 16))


def cpu_copy_bytes() -> int:
    """128 MiB, or an eighth of the memory free now on a small machine."""
    import psutil

    available: int = psutil.virtual_memory().available
    return max(8 * MiB, min(CPU_COPY_BYTES, available // 8))
