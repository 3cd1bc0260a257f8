"""The way to the coordinator: round trips, then download and upload throughput.

Measured over the agent's own connection (its pool, its TLS: see `uplink`), against
endpoints made for it (`/v1/agent/benchmarks/ping|download|upload`). The first ping opens the
connection and is not counted; each transfer stops at its byte count or its time
budget, whichever comes first, so a slow link costs seconds, not minutes.
"""

import statistics
import time

from gpu_share.agent.benchmarks.uplink import Uplink
from gpu_share.protocol.benchmarks import NetworkMeasurement

MiB = 1024 * 1024
PINGS = 10
DOWNLOAD_BYTES = 32 * MiB
UPLOAD_BYTES = 16 * MiB
TRANSFER_SEC = 5.0


def _mbps(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / max(seconds, 1e-6) / 1e6


async def measure_network(
    uplink: Uplink,
    *,
    pings: int = PINGS,
    download_bytes: int = DOWNLOAD_BYTES,
    upload_bytes: int = UPLOAD_BYTES,
    transfer_sec: float = TRANSFER_SEC,
) -> NetworkMeasurement:
    await uplink.benchmark_ping()
    round_trips = []
    for _ in range(pings):
        started = time.perf_counter()
        await uplink.benchmark_ping()
        round_trips.append((time.perf_counter() - started) * 1000)
    started = time.perf_counter()
    received = await uplink.benchmark_download(download_bytes, transfer_sec)
    download = _mbps(received, time.perf_counter() - started)
    started = time.perf_counter()
    sent = await uplink.benchmark_upload(upload_bytes, transfer_sec)
    upload = _mbps(sent, time.perf_counter() - started)
    return NetworkMeasurement(
        rtt_ms=statistics.median(round_trips), download_mbps=download, upload_mbps=upload
    )
