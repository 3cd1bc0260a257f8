"""bubblewrap: each job in its own namespaces, seeing a Python runtime, its folder, its inputs.

The sandbox's root is an empty tmpfs made read-only once it is furnished. Into it go,
read-only: the system directories a dynamically linked Python needs (`/usr`, `/bin`,
`/lib`…), a few `/etc` files for the dynamic linker, made-up `passwd`/`group`/`hosts`
so the host's accounts stay private, the Python installation and the agent's own
package. Read-write: the job folder at `/job` (also the working directory), and
private tmpfs at `/tmp` and `/dev/shm`. Inputs are bound read-only at
`/job/in/<name>`; nothing else of the host (other jobs, the cache, the agent's key)
exists inside. The network namespace has only its own loopback.

Running as root, the job runs as uid/gid 65534 in a new user namespace that maps it
to the agent's own uid outside: files it writes are the agent's, but it holds no
capability on the host and everything it can reach is read-only except its folder.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

import gpu_share
from gpu_share.agent.sandbox.base import (
    INPUTS_DIR,
    INSIDE_JOB_DIR,
    NOBODY,
    PRIVATE_TMP,
    MiB,
    SandboxError,
    SandboxSpec,
    SandboxUnavailable,
    check_spec,
    job_environment,
    nvidia_minor_numbers,
)
from gpu_share.agent.sandbox.process import SubprocessJob, start_supervised

SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib64", "lib32")
HOST_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
SYNTHETIC_ETC_FILES = {
    "passwd": (
        f"root:x:0:0:root:{INSIDE_JOB_DIR}:/usr/sbin/nologin\n"
        f"nobody:x:{NOBODY}:{NOBODY}:nobody:{INSIDE_JOB_DIR}:/usr/sbin/nologin\n"
    ),
    "group": f"root:x:0:\nnogroup:x:{NOBODY}:\n",
    "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
}
PRIVATE_SHM = "/dev/shm"  # noqa: S108 - the sandbox's own tmpfs
NVIDIA_CONTROL_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora/RHEL: "
    "`dnf install bubblewrap`) and allow user namespaces (sysctl "
    "kernel.unprivileged_userns_clone=1, or run the agent as root); inside a container "
    "the agent needs `--privileged` or the Docker sandbox instead"
)


class BwrapSandbox:
    """Runs each job under bubblewrap; `command()` is the whole policy, as one argv."""

    name = "bwrap"
    isolated = True

    def __init__(
        self,
        *,
        executable: str = "bwrap",
        gpu_minor_numbers: Mapping[str, int] | None = None,
        user_namespace: bool = True,
        runtime_paths: Sequence[Path] | None = None,
        tmp_size_bytes: int = 1024 * MiB,
        shm_size_bytes: int = 256 * MiB,
        supported_options: Collection[str] | None = None,
    ) -> None:
        """`gpu_minor_numbers` maps a GPU's UUID to N of its `/dev/nvidiaN`; without it no
        GPU device node is bound (see `nvidia_minor_numbers()` to read it from the driver).
        `user_namespace=False` is for kernels that refuse one: the job then keeps uid 0,
        still without capabilities. `supported_options` (from `bwrap --help`, see
        `bwrap_options()`) leaves out the hardening an older bwrap lacks; None assumes ≥ 0.8."""
        self.executable = executable
        self.supported_options = (
            frozenset(supported_options) if supported_options is not None else None
        )
        self.gpu_minor_numbers = dict(gpu_minor_numbers) if gpu_minor_numbers is not None else None
        self.user_namespace = user_namespace
        self.runtime_paths = (
            outermost(runtime_paths) if runtime_paths is not None else python_runtime_paths()
        )
        self.tmp_size_bytes = tmp_size_bytes
        self.shm_size_bytes = shm_size_bytes

    def command(self, spec: SandboxSpec) -> list[str]:
        """The bwrap argv that runs `spec`; bwrap applies the mount operations in this order."""
        check_spec(spec)
        job_dir = spec.job_dir.resolve()
        inputs = {name: Path(path).resolve() for name, path in spec.inputs.items()}
        system = system_mounts()
        refuse_exposed_data(
            [job_dir, *inputs.values()],
            exposed=[*self.runtime_paths, *(Path("/", d) for d in SYSTEM_DIRS)],
        )

        argv = [self.executable, "--unshare-all"]
        if self.user_namespace:
            argv += ["--unshare-user"]
            # No nested user namespace: it would hand the job capabilities over a new
            # namespace, and with them much more of the kernel to probe.
            argv += self._if_supported("--disable-userns")
            argv += ["--uid", str(NOBODY), "--gid", str(NOBODY)]
        argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        # Without --clearenv (bwrap < 0.5) the job inherits bwrap's own environment,
        # which start() reduces to PATH.
        argv += ["--hostname", "gpu-share-job", *self._if_supported("--clearenv")]
        for key, value in job_environment(spec, home=INSIDE_JOB_DIR).items():
            argv += ["--setenv", key, value]

        argv += system
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += [*self._if_supported("--size", str(self.tmp_size_bytes)), "--tmpfs", PRIVATE_TMP]
        argv += [*self._if_supported("--size", str(self.shm_size_bytes)), "--tmpfs", PRIVATE_SHM]
        for name in HOST_ETC_FILES:
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        etc_dir = synthetic_etc()
        for name in SYNTHETIC_ETC_FILES:
            argv += ["--ro-bind", str(etc_dir / name), f"/etc/{name}"]
        # After /tmp: a virtualenv living under /tmp must not be hidden by the private tmpfs.
        for path in self.runtime_paths:
            argv += ["--ro-bind", str(path), str(path)]
        argv += self._gpu_mounts(spec.gpu_uuids)

        argv += ["--bind", str(job_dir), INSIDE_JOB_DIR]
        for name, path in inputs.items():
            argv += ["--ro-bind", str(path), f"{INSIDE_JOB_DIR}/{INPUTS_DIR}/{name}"]
        # Furnished: nothing but /job, /tmp and /dev/shm stays writable.
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
        argv += ["--chdir", INSIDE_JOB_DIR, "--", *spec.argv]
        return argv

    async def start(self, spec: SandboxSpec) -> SubprocessJob:
        argv = self.command(spec)
        if not spec.job_dir.is_dir():
            raise SandboxError(f"job folder {spec.job_dir} does not exist")
        refuse_reachable_parent(spec.job_dir.resolve())
        if spec.inputs:
            # bwrap would create it as the mount point anyway; made here it is the agent's.
            (spec.job_dir / INPUTS_DIR).mkdir(exist_ok=True)
        try:
            return await start_supervised(
                argv,
                spec=spec,
                env={"PATH": os.environ.get("PATH", os.defpath)},
                cwd=None,
                after_exit=strip_setid_bits,
            )
        except SandboxError as exc:
            if f"cannot start {self.executable}" not in str(exc):
                raise
            raise SandboxUnavailable(f"{exc}; {INSTALL_HINT}") from exc

    def _if_supported(self, option: str, *values: str) -> list[str]:
        if self.supported_options is None or option in self.supported_options:
            return [option, *values]
        return []

    def _gpu_mounts(self, gpu_uuids: Sequence[str]) -> list[str]:
        if not gpu_uuids:
            return []
        argv: list[str] = []
        for device in NVIDIA_CONTROL_DEVICES:
            argv += ["--dev-bind-try", device, device]
        if self.gpu_minor_numbers is not None:
            for uuid in gpu_uuids:
                minor = self.gpu_minor_numbers.get(uuid)
                if minor is None:
                    raise SandboxError(f"GPU {uuid} is not one of this machine's GPUs")
                argv += ["--dev-bind", f"/dev/nvidia{minor}", f"/dev/nvidia{minor}"]
        argv += ["--ro-bind-try", "/proc/driver/nvidia", "/proc/driver/nvidia"]
        return argv


@functools.cache
def synthetic_etc() -> Path:
    """One folder per agent process holding the made-up /etc files; their text never changes."""
    etc_dir = Path(tempfile.mkdtemp(prefix="gpu-share-sandbox-etc-"))
    atexit.register(shutil.rmtree, etc_dir, ignore_errors=True)
    for name, text in SYNTHETIC_ETC_FILES.items():
        (etc_dir / name).write_text(text)
        (etc_dir / name).chmod(0o444)
    etc_dir.chmod(0o555)
    return etc_dir


def system_mounts(root: Path = Path("/")) -> list[str]:
    """Bind the system directories read-only, keeping usr-merge symlinks (`/bin -> usr/bin`)."""
    argv: list[str] = []
    for name in SYSTEM_DIRS:
        host = root / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"/{name}"]
    return argv


def python_runtime_paths() -> list[Path]:
    """What a job's Python needs besides /usr: the interpreter's prefixes, the venv, the
    folder holding `gpu_share` (the source tree under an editable install) and any
    site-packages on `sys.path`. Only those: never the repository or the agent's data."""
    candidates = [
        Path(sys.base_prefix),
        Path(sys.base_exec_prefix),
        Path(sys.prefix),
        Path(sys.exec_prefix),
        Path(gpu_share.__file__).resolve().parent.parent,
    ]
    candidates += [
        Path(entry)
        for entry in sys.path
        if entry and Path(entry).name in ("site-packages", "dist-packages")
    ]
    with_real = [*candidates, *(path.resolve() for path in candidates)]
    system = [Path("/", name) for name in SYSTEM_DIRS]
    return [
        path
        for path in outermost(p for p in with_real if p.is_dir())
        if not any(path.is_relative_to(s) for s in system)
    ]


def outermost(paths: Iterable[Path]) -> list[Path]:
    """The given absolute paths less any inside another, in a stable order."""
    unique = sorted({Path(os.path.normpath(p)) for p in paths}, key=lambda p: (len(p.parts), p))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(parent) for parent in kept):
            kept.append(path)
    return kept


def refuse_exposed_data(private: Iterable[Path], *, exposed: Iterable[Path]) -> None:
    """Refuse to run if a job folder or an input sits inside something every job sees.

    Its siblings (other jobs, the rest of the cache, the agent's key) would be readable
    through that read-only bind.
    """
    exposed = list(exposed)
    for path in private:
        for shown in exposed:
            if path.parent.is_relative_to(shown):
                raise SandboxError(
                    f"{path} lies inside {shown}, which every sandboxed job can read; "
                    "keep the agent's data directory outside the Python installation"
                )


def refuse_reachable_parent(job_dir: Path) -> None:
    """Refuse a job folder that other users of this machine could reach.

    The job's files belong to the agent's user on the host (root, for a root agent), and
    a job may set the set-user-ID bit on a program it writes: in a reachable folder, any
    local user could run it as the agent while the job runs. The parent is what guards the
    folder, since the job, owning its folder, can loosen the folder's own mode.
    """
    mode = job_dir.parent.stat().st_mode
    if mode & 0o077:
        raise SandboxError(
            f"{job_dir.parent} is open to other users (mode {stat.S_IMODE(mode):o}); "
            f"make it 0700 (`chmod 700 {job_dir.parent}`) before running jobs in it"
        )


def strip_setid_bits(root: Path) -> None:
    """Clear set-user-ID and set-group-ID bits a finished job left in its folder.

    Nothing of the job runs any more (its PID namespace is gone), so no file can be
    swapped for a link between the check and the chmod.
    """
    setid = stat.S_ISUID | stat.S_ISGID
    for folder, dirs, files in os.walk(root):
        for path in [Path(folder), *(Path(folder, name) for name in [*dirs, *files])]:
            with contextlib.suppress(FileNotFoundError):
                mode = path.lstat().st_mode
                if mode & setid and not stat.S_ISLNK(mode):
                    path.chmod(stat.S_IMODE(mode) & ~setid)


def probe_user_namespace(executable: str) -> bool:
    """Whether bwrap runs a trivial Python job here as uid 65534 in a user namespace (True) or
    only without one (False); raises SandboxUnavailable when neither works. Probed once per
    executable."""
    user_namespace, errors = _probe(executable)
    if user_namespace is None:
        raise SandboxUnavailable(f"bubblewrap does not work here ({errors}): {INSTALL_HINT}")
    return user_namespace


@functools.cache
def _probe(executable: str) -> tuple[bool | None, str]:
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu-share-bwrap-probe-") as tmp:
        spec = SandboxSpec(
            argv=[sys.executable, "-c", "import gpu_share"],
            job_dir=Path(tmp),
            inputs={},
            env={},
        )
        for user_namespace in (True, False):
            sandbox = BwrapSandbox(
                executable=executable,
                user_namespace=user_namespace,
                supported_options=bwrap_options(executable) or None,
            )
            argv = sandbox.command(spec)
            try:
                result = subprocess.run(
                    argv,
                    env={"PATH": os.environ.get("PATH", os.defpath)},
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                errors.append(str(exc))
                continue
            if result.returncode == 0:
                return user_namespace, ""
            errors.append((result.stderr or result.stdout).strip() or f"exit {result.returncode}")
    return None, "; ".join(errors)


def detect_bwrap(executable: str = "bwrap") -> BwrapSandbox:
    """A bubblewrap sandbox if bwrap is installed and works here, its GPU device nodes read
    from the NVIDIA driver; otherwise SandboxUnavailable saying how to install it."""
    found = shutil.which(executable)
    if found is None:
        raise SandboxUnavailable(f"bwrap is not installed: {INSTALL_HINT}")
    return BwrapSandbox(
        executable=found,
        user_namespace=probe_user_namespace(found),
        gpu_minor_numbers=nvidia_minor_numbers(),
        supported_options=bwrap_options(found) or None,
    )


@functools.cache
def bwrap_options(executable: str) -> frozenset[str]:
    """The options this bwrap knows, from its `--help` (empty if it will not say); an older
    one lacks some hardening."""
    try:
        result = subprocess.run(
            [executable, "--help"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(re.findall(r"^\s+(--[a-z0-9-]+)", result.stdout + result.stderr, re.M))
