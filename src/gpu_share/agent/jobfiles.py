"""Reading files a job wrote, without letting the job point the agent elsewhere.

The agent runs as a more privileged user than the job. A job could replace a file it
is expected to produce (or a folder above it) with a symlink to a host file, hoping
the agent uploads that file as the job's output. Every path is therefore opened one
component at a time relative to the job folder, refusing symlinks at each step, and
only regular files are read.
"""

import errno
import os
import shutil
import stat
from pathlib import Path, PurePosixPath


class UnsafeJobFile(Exception):
    """The path leaves the job folder, passes through a symlink, or is not a regular file."""


def open_inside(job_dir: Path, relative: str) -> int:
    """A read-only file descriptor for `job_dir/relative`; raises UnsafeJobFile or OSError."""
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or ".." in parts:
        raise UnsafeJobFile(f"{relative!r} is not a path inside the job folder")
    fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        # O_NONBLOCK: opening a FIFO the job planted must not hang the agent.
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink, or one where a folder was
            raise UnsafeJobFile(f"{relative!r} passes through a symlink") from exc
        raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise UnsafeJobFile(f"{relative!r} is not a regular file")
    return file_fd


def copy_out(job_dir: Path, relative: str, dest: Path) -> int:
    """Copy a job's file to `dest` (outside the job's reach); returns its size."""
    fd = open_inside(job_dir, relative)
    with os.fdopen(fd, "rb") as source, dest.open("wb") as target:
        shutil.copyfileobj(source, target, 1 << 20)
        return target.tell()


def read_small(job_dir: Path, relative: str, limit: int = 1 << 20) -> bytes:
    fd = open_inside(job_dir, relative)
    with os.fdopen(fd, "rb") as source:
        data = source.read(limit + 1)
    if len(data) > limit:
        raise UnsafeJobFile(f"{relative!r} is larger than {limit} bytes")
    return data


def stat_inside(job_dir: Path, relative: str) -> os.stat_result | None:
    """The file's stat if it safely exists, else None."""
    try:
        fd = open_inside(job_dir, relative)
    except (OSError, UnsafeJobFile):
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)
