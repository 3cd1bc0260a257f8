"""The agent never follows a job's symlinks out of the job folder."""

import os
from pathlib import Path

import pytest

from gpu_share.agent.jobfiles import UnsafeJobFile, copy_out, read_small, stat_inside


@pytest.fixture
def job(tmp_path: Path) -> Path:
    job_dir = tmp_path / "job"
    (job_dir / "out").mkdir(parents=True)
    (tmp_path / "host-secret").write_text("root:x:0:0")
    return job_dir


def test_regular_files_inside_the_job_are_read(job: Path, tmp_path: Path) -> None:
    (job / "out" / "result.json").write_text('{"ok": true}')
    assert read_small(job, "out/result.json") == b'{"ok": true}'
    assert copy_out(job, "out/result.json", tmp_path / "copy") == 12
    assert stat_inside(job, "out/result.json") is not None


def test_a_symlinked_file_is_refused(job: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path / "host-secret", job / "out" / "result.json")
    with pytest.raises(UnsafeJobFile, match="symlink"):
        read_small(job, "out/result.json")
    assert stat_inside(job, "out/result.json") is None


def test_a_symlinked_folder_on_the_way_is_refused(job: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "snapshot.cbs").write_text("host data")
    os.symlink(tmp_path / "elsewhere", job / "checkpoint")
    with pytest.raises(UnsafeJobFile):
        copy_out(job, "checkpoint/snapshot.cbs", tmp_path / "copy")


@pytest.mark.parametrize("path", ["../host-secret", "/etc/passwd", "", "out/../../host-secret"])
def test_paths_leaving_the_job_are_refused(job: Path, path: str) -> None:
    with pytest.raises(UnsafeJobFile):
        read_small(job, path)


def test_special_files_are_refused(job: Path) -> None:
    os.mkfifo(job / "out" / "outputs.npz")  # reading it would block the agent forever
    with pytest.raises(UnsafeJobFile, match="regular file"):
        read_small(job, "out/outputs.npz")


def test_oversized_small_reads_are_refused(job: Path) -> None:
    (job / "out" / "result.json").write_bytes(b"x" * 100)
    with pytest.raises(UnsafeJobFile, match="larger"):
        read_small(job, "out/result.json", limit=10)
