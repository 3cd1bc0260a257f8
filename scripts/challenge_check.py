"""A hardware challenge at full size on this machine's GPUs: run it where there is one
(`python scripts/challenge_check.py [--scale S] [--samples M] [--cpu]`).

For each GPU NVML lists whose model the catalog knows, it sizes the challenge as the
coordinator does (its settings, `GPUSHARE_CHALLENGE_*`), runs the chain as the agent's
child does (onnxruntime's CUDA provider, FP16, the state on the GPU), then checks random
samples as the coordinator does. It prints the time against the deadline and the rate
against the datasheet. `--cpu` does the same for this machine as a CPU node. Exits 1 if
NVML lists no GPU, 2 if a challenge would fail.
"""

import argparse
import base64
import os
import secrets
import sys
import time

import psutil

os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA's ordinals as NVML's indices

from gpu_share.agent.benchmarks.engine import Place
from gpu_share.agent.challenges.child import reveal_of, shape_of
from gpu_share.agent.challenges.device_chain import DeviceChain
from gpu_share.agent.gpu import Nvml
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.services.trust import challenge_checks, challenges
from gpu_share.coordinator.services.trust.hardware_claims import Claim
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.trust import (
    ChallengeCommitted,
    ChallengeKind,
    ChallengeParams,
    ChallengeSample,
)

NO_GPU, FAILED = 1, 2


def run_and_check(params: ChallengeParams, place: Place, datasheet: float, unit: float) -> bool:
    """The chain as the agent's child runs it, the samples as the coordinator checks them;
    True if it would pass. `datasheet` is the claimed rate in FLOP/s / `unit`."""
    shape = shape_of(params)
    print(
        f"  {params.steps} steps over {params.rows} rows of {params.width} "
        f"({shape.state_bytes / 1e9:.2f} GB a state), chunks of {params.sketch_rows}, "
        f"deadline {params.deadline_sec:g} s"
    )
    seed = secrets.token_hex(16)
    chain = DeviceChain(shape, place, keep_bytes=0)
    started = time.perf_counter()
    chain.load(seed)
    sketches = chain.run()
    elapsed = time.perf_counter() - started
    rate = shape.flops / elapsed / unit
    print(
        f"  chain: {elapsed:.2f} s ({elapsed / params.deadline_sec:.0%} of the deadline), "
        f"{rate:.1f} = {rate / datasheet:.0%} of the claimed rate"
    )
    raw = sketches.astype("<i4").tobytes()
    asked = challenge_checks.asked_from({"asked": challenges.choose_samples(seed, params, raw)})
    committed = ChallengeCommitted(
        samples=[ChallengeSample(step=a.step, chunk=a.chunk) for a in asked]
    )
    started = time.perf_counter()
    reveal = reveal_of(chain, committed)
    revealed = time.perf_counter() - started
    size = sum(len(base64.b64decode(s.before)) * 3 for s in reveal.samples)
    print(f"  reveal: {revealed:.2f} s (recomputed), {size / 1e6:.2f} MB of rows")
    started = time.perf_counter()
    why = challenge_checks.check(seed, params, asked, reveal)
    print(f"  check: {time.perf_counter() - started:.2f} s on the host: {why or 'passed'}")
    chain.close()
    return why is None and elapsed <= params.deadline_sec and revealed <= params.deadline_sec


def challenge_gpu(ordinal: int, info: GpuInfo, settings: Settings) -> bool:
    model = gpu_catalog.match(info.model, info.vram_mb)
    if model is None:
        print(f"GPU {info.index} {info.model}: not in the catalog, never challenged")
        return True
    claim = Claim(
        target=info.uuid,
        kind=ChallengeKind.GPU,
        model=model.name,
        rate_flops=model.fp16_tflops * 1e12,
        memory_bytes=info.vram_mb * 1024 * 1024,
        gpu_index=info.index,
    )
    params = challenges.params_for(claim, settings)
    assert params is not None
    print(f"GPU {info.index} {model.name} (TFLOP/s, FP16):")
    return run_and_check(params, Place.gpu(ordinal), model.fp16_tflops, 1e12)


def challenge_cpu(settings: Settings) -> bool:
    cores = os.cpu_count() or 1
    per_core = gpu_catalog.CPU_BASELINE.matmul_gflops_per_core
    claim = Claim(
        target="cpu",
        kind=ChallengeKind.CPU,
        model=f"{cores} cores",
        rate_flops=cores * per_core * 1e9,
        memory_bytes=psutil.virtual_memory().total,
        cores=cores,
    )
    params = challenges.params_for(claim, settings)
    assert params is not None
    print(f"CPU, {cores} cores (GFLOP/s, FP32):")
    return run_and_check(params, Place.cpu(cores), cores * per_core, 1e9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=None, help="GPUSHARE_CHALLENGE_SCALE")
    parser.add_argument("--samples", type=int, default=None, help="GPUSHARE_CHALLENGE_SAMPLES")
    parser.add_argument("--cpu", action="store_true", help="this machine as a CPU node")
    args = parser.parse_args()
    settings = Settings()
    if args.scale is not None:
        settings.challenge_scale = args.scale
    if args.samples is not None:
        settings.challenge_samples = args.samples
    if args.cpu:
        return 0 if challenge_cpu(settings) else FAILED
    nvml = Nvml()
    gpus = nvml.discover()
    nvml.shutdown()
    if not gpus:
        print("NVML lists no GPU")
        return NO_GPU
    passed = [challenge_gpu(ordinal, gpu.info, settings) for ordinal, gpu in enumerate(gpus)]
    return 0 if all(passed) else FAILED


if __name__ == "__main__":
    sys.exit(main())
