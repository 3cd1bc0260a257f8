"""`upload_artifact` streams: a 400 MiB upload from a child process whose peak RSS
stays a fraction of the file, against the real coordinator on a real socket."""

import asyncio
import hashlib
import io
import json
import shutil
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.factories import TEST_ADMIN_KEY, create_tenant
from gpu_share.testing.servers import serve

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status"),
]

MiB = 1024 * 1024
FILE_SIZE = 400 * MiB
RSS_LIMIT = 100 * MiB  # the interpreter, httpx and pydantic take about 45 MiB

# Peak RSS from VmHWM, the high-water mark of this process image: getrusage's ru_maxrss
# would carry over the RSS of the pytest process this child was forked from (Linux keeps
# the maximum across exec).
CHILD = """
import json, sys
from gpu_share import Client
with Client(sys.argv[1], sys.argv[2], progress=False) as client:
    artifact = client.upload_artifact(sys.argv[3], "inputs")
status = open("/proc/self/status").read().split("VmHWM:")[1]
peak = int(status.split()[0]) * 1024
print(json.dumps({"id": artifact.id, "sha256": artifact.sha256, "peak_rss": peak}))
"""


@pytest.fixture
async def sqlite_app(sqlite_template: Path, tmp_path: Path) -> AsyncIterator[FastAPI]:
    """The database plays no part here, so one kind is enough."""
    database = tmp_path / "gpushare.db"
    shutil.copy(sqlite_template, database)
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{database}",
        admin_key=SecretStr(TEST_ADMIN_KEY),
        run_background_loops=False,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


class _Holes(io.RawIOBase):
    """Writes runs of zeros as holes, so the file costs no disk for them."""

    def __init__(self, file: BinaryIO) -> None:
        super().__init__()
        self.file = file

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        if data.count(0) == len(data):
            self.file.seek(len(data), io.SEEK_CUR)
        else:
            self.file.write(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()


def make_big_file(path: Path) -> str:
    """An inputs NPZ (an upload is checked for what its kind promises) of one uint8 array,
    sparse so it costs no disk, with a few marks so its hash is not that of zeros."""
    length = FILE_SIZE - 4096  # the zip's and the array's headers take the rest
    marks = [(offset, b"gpu-share mark %d" % offset) for offset in (0, length // 3, length - 64)]
    with (
        path.open("wb") as raw,
        zipfile.ZipFile(_Holes(raw), "w", zipfile.ZIP_STORED) as archive,  # ends with its
        archive.open("x.npy", "w", force_zip64=True) as member,  # directory: no hole last
    ):
        header = {"descr": "|u1", "fortran_order": False, "shape": (length,)}
        np.lib.format.write_array_header_1_0(member, header)
        written = 0
        for offset, mark in [*marks, (length, b"")]:
            while written < offset:
                step = min(4 * MiB, offset - written)
                member.write(bytes(step))
                written += step
            member.write(mark)
            written += len(mark)
    hasher = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(4 * MiB):
            hasher.update(chunk)
    return hasher.hexdigest()


async def test_upload_of_a_400_mib_file_streams_with_flat_memory(
    sqlite_app: FastAPI, tmp_path: Path
) -> None:
    path = tmp_path / "big.npz"
    expected = await asyncio.to_thread(make_big_file, path)
    async with (
        serve(sqlite_app, lifespan=False) as base_url,
        httpx.AsyncClient(base_url=base_url) as http,
    ):
        tenant = await create_tenant(http)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            base_url,
            tenant.key,
            str(path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(child.communicate(), timeout=120)
        assert child.returncode == 0, err.decode()
        report = json.loads(out)
        stored = (await http.get(f"/v1/artifacts/{report['id']}", headers=tenant.headers)).json()
    assert report["sha256"] == expected
    assert (stored["sha256"], stored["size"]) == (expected, path.stat().st_size)
    assert report["peak_rss"] < RSS_LIMIT, f"peak RSS {report['peak_rss'] / MiB:.0f} MiB"
