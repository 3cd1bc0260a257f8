"""Upload throughput of POST /v1/artifacts against its baselines (issue: coordinator foundation).

Side by side in one run, on loopback, with the same client (curl, streaming the file):
  (a) our server / a bare uvicorn ASGI app that only hashes the body (bench/bare_upload_app.py)
  (b) our server / `openssl dgst -sha256` on the same file (the floor of the work)
  (c) the server's peak RSS growth during the 512 MiB upload
  (d) 512 MiB time / 64 MiB time (8.0 is linear; catches quadratic buffering)
With --storage s3 the server stores into a bucket of a real S3 endpoint (moto, started
here), and one more baseline runs beside it:
  (e) our server / the same file sent straight to the same bucket as a multipart upload
      (obstore, the parts the store uses): what the coordinator adds in front of S3

Run: .venv/bin/python bench/upload.py [--size-mib 512] [--storage s3]
"""

import argparse
import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import obstore
import psutil
from obstore.store import S3Store

from gpu_share.coordinator.storage.s3 import PART_BYTES, PARTS_IN_FLIGHT
from gpu_share.testing.s3 import CREDENTIALS, S3Endpoint
from gpu_share.testing.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def make_file(path: Path, size: int) -> str:
    """An NPZ of one float32 array filling `size` bytes (uploads of inputs are checked to
    be readable archives), written without holding it whole; returns its SHA-256."""
    block = os.urandom(1 << 20)
    blocks = size // len(block)
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive,
        archive.open("x.npy", "w", force_zip64=True) as member,
    ):
        header = {"descr": "<f4", "fortran_order": False, "shape": (blocks * len(block) // 4,)}
        np.lib.format.write_array_header_1_0(member, header)
        for i in range(blocks):
            member.write(block[:-8] + i.to_bytes(8, "little"))
    hasher = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


def wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("server did not start")


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self) -> "RssSampler":
        self.start_rss = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def curl_upload(url: str, path: Path, headers: dict[str, str]) -> tuple[float, dict[str, object]]:
    argv = [
        "curl",
        "-sS",
        "-X",
        "POST",
        "-T",
        str(path),
        "-H",
        "Content-Type: application/octet-stream",
    ]
    for k, v in headers.items():
        argv += ["-H", f"{k}: {v}"]
    start = time.perf_counter()
    out = subprocess.run([*argv, url], capture_output=True, check=True)
    elapsed = time.perf_counter() - start
    return elapsed, json.loads(out.stdout)


def best_of(n: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(n))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--small-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--storage", choices=["local", "s3"], default="local")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        work = Path(tmp)
        big, small = work / "big.bin", work / "small.bin"
        big_sha = make_file(big, args.size_mib << 20)
        small_sha = make_file(small, args.small_mib << 20)

        admin_key = "gpu_admin_" + secrets.token_urlsafe(24)
        port, bare_port = free_port(), free_port()
        env = {
            **os.environ,
            "GPUSHARE_DATA_DIR": str(work / "data"),
            "GPUSHARE_ADMIN_KEY": admin_key,
            "GPUSHARE_PORT": str(port),
        }
        s3 = S3Endpoint.start(work) if args.storage == "s3" else None
        if s3 is not None:
            os.environ.update(CREDENTIALS)
            bucket = s3.create_bucket()
            env |= {
                **CREDENTIALS,
                "GPUSHARE_STORAGE": "s3",
                "GPUSHARE_S3_BUCKET": bucket,
                "GPUSHARE_S3_ENDPOINT_URL": s3.url,
            }
        server = subprocess.Popen(
            [PYTHON, "-m", "gpu_share.cli.main", "server", "--log-level", "warning"],
            env=env,
            cwd=ROOT,
        )
        bare = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "uvicorn",
                "bench.bare_upload_app:app",
                "--port",
                str(bare_port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(f"{base}/health", server)
            wait_healthy(f"http://127.0.0.1:{bare_port}/", bare)
            tenant = httpx.post(
                f"{base}/v1/admin/tenants",
                json={"name": "bench", "email": "bench@example.com"},
                headers={"Authorization": f"Bearer {admin_key}"},
            ).json()
            auth = {"Authorization": f"Bearer {tenant['api_key']}"}

            def ours(path: Path, digest: str) -> float:
                url = f"{base}/v1/artifacts?kind=inputs&content_sha256={digest}"
                elapsed, body = curl_upload(url, path, auth)
                assert body.get("sha256") == digest, body
                httpx.delete(f"{base}/v1/artifacts/{body['id']}", headers=auth)
                return elapsed

            def baseline(path: Path, digest: str) -> float:
                elapsed, body = curl_upload(f"http://127.0.0.1:{bare_port}/", path, {})
                assert body["sha256"] == digest, body
                return elapsed

            def openssl() -> float:
                start = time.perf_counter()
                subprocess.run(
                    ["openssl", "dgst", "-sha256", str(big)], check=True, capture_output=True
                )
                return time.perf_counter() - start

            def straight_to_s3() -> float:
                assert s3 is not None
                store = S3Store(bucket, endpoint=s3.url, client_options={"allow_http": True})
                start = time.perf_counter()
                with (
                    big.open("rb") as f,
                    obstore.open_writer(
                        store, "direct", buffer_size=PART_BYTES, max_concurrency=PARTS_IN_FLIGHT
                    ) as writer,
                ):
                    while chunk := f.read(1 << 20):
                        writer.write(chunk)
                elapsed = time.perf_counter() - start
                obstore.delete(store, "direct")
                return elapsed

            ours(small, small_sha)  # warm up
            t_direct = best_of(args.repeat, straight_to_s3) if s3 is not None else None
            t_bare = best_of(args.repeat, lambda: baseline(big, big_sha))
            t_openssl = best_of(args.repeat, openssl)
            with RssSampler(server.pid) as rss:
                t_ours = best_of(args.repeat, lambda: ours(big, big_sha))
            t_small = best_of(args.repeat, lambda: ours(small, small_sha))
        finally:
            server.terminate()
            bare.terminate()
            server.wait()
            bare.wait()
            if s3 is not None:
                s3.stop()

    mib = args.size_mib
    print(f"file: {mib} MiB, best of {args.repeat}, storage: {args.storage}")
    print(f"  ours (POST /v1/artifacts):   {t_ours:6.3f} s  {mib / t_ours:7.1f} MiB/s")
    print(f"  bare uvicorn hash-and-drop:  {t_bare:6.3f} s  {mib / t_bare:7.1f} MiB/s")
    print(f"  openssl dgst -sha256:        {t_openssl:6.3f} s  {mib / t_openssl:7.1f} MiB/s")
    print(f"(a) throughput ours / bare uvicorn:  {t_bare / t_ours:.2f}   (target >= 0.8)")
    print(f"(b) throughput ours / openssl:       {t_openssl / t_ours:.2f}")
    growth = (rss.peak - rss.start_rss) / (1 << 20)
    print(f"(c) server peak RSS growth:          {growth:.1f} MiB   (target < 64)")
    ratio = t_ours / t_small
    print(f"(d) time {mib} MiB / {args.small_mib} MiB:           {ratio:.2f}   (target <= 8.8)")
    if t_direct is not None:
        print(f"  straight to the bucket:      {t_direct:6.3f} s  {mib / t_direct:7.1f} MiB/s")
        print(f"(e) throughput ours / straight to the bucket: {t_direct / t_ours:.2f}")


if __name__ == "__main__":
    main()
