"""Getting the agent onto a provider's machine (SPEC §3.2): the install script and the
wheel it installs, both without a key.

`curl -fsSL https://HOST/agent/install.sh | sudo bash -s -- --token gpu_et_…` needs nothing
else: the script arrives with this coordinator's public URL and the wheel's name filled
in. The URL is the configured one only, never the request's `Host`, which whoever sends
the request chooses. The wheel is this coordinator's own package, zipped from the files
it runs, so a coordinator without PyPI still hands out the agent; the provider's pip
fetches only its dependencies.
"""

import asyncio
import base64
import hashlib
import importlib.metadata
import re
import shlex
import threading
import zipfile
from functools import cache
from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

import gpu_share
from gpu_share._version import __version__
from gpu_share.coordinator.api.responses import errors
from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.http.replica import ReplicaDep, public_url

router = APIRouter(tags=["agent installation"])

WHEEL_NAME = f"gpu_share-{__version__.replace('-', '_')}-py3-none-any.whl"
WHEEL_PATH = f"/agent/{WHEEL_NAME}"
# Package data shipped under web/static; read as a file, not imported from that layer.
SCRIPT = resources.files("gpu_share.coordinator").joinpath("web", "static", "install.sh")
# The script's own lines that name them, whole, so a mention elsewhere is never filled in.
SERVER_LINE = "\nSERVER_DEFAULT=@GPU_SHARE_SERVER@\n"
WHEEL_LINE = "\nWHEEL_NAME=@GPU_SHARE_WHEEL@\n"


@router.get(
    "/agent/install.sh",
    response_class=Response,
    responses={200: {"content": {"text/x-shellscript": {}}, "description": "A bash script"}},
)
async def install_script(replica: ReplicaDep) -> Response:
    """The agent's installer, for `curl -fsSL …/agent/install.sh | sudo bash -s -- --token
    gpu_et_…`; `bash -s -- --help` lists its options. Needs no key. Its coordinator is the
    configured public URL (`GPUSHARE_PUBLIC_BASE_URL`); without one the script needs
    `--server` and says so."""
    text = (
        _script_template()
        .replace(SERVER_LINE, f"\nSERVER_DEFAULT={shlex.quote(public_url(replica))}\n", 1)
        .replace(WHEEL_LINE, f"\nWHEEL_NAME={shlex.quote(WHEEL_NAME)}\n", 1)
    )
    return Response(text, media_type="text/x-shellscript", headers={"Cache-Control": "no-cache"})


@router.get(
    WHEEL_PATH,
    response_class=FileResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "A wheel"},
        **errors(404),
    },
)
async def agent_wheel(replica: ReplicaDep) -> FileResponse:
    """This coordinator's own package as a wheel, which install.sh installs with the `agent`
    extras. Built from the running code on the first request after each start. Needs no key."""
    path = await asyncio.to_thread(_built_wheel, replica.settings.data_dir / "agent")
    return FileResponse(path, media_type="application/octet-stream", filename=WHEEL_NAME)


@cache
def _script_template() -> str:
    return SCRIPT.read_text(encoding="utf-8")


_build_lock = threading.Lock()
_built: set[Path] = set()


def _built_wheel(folder: Path) -> Path:
    """The wheel in `folder`, built once per process: a restarted coordinator may run
    new code under the same version, so a wheel left by an earlier start is replaced."""
    target = folder / WHEEL_NAME
    with _build_lock:
        if target not in _built or not target.is_file():
            build_wheel(target)
            _built.add(target)
    return target


def build_wheel(target: Path) -> None:
    """Zip the `gpu_share` package this process runs into a pure-Python wheel at `target`.

    The files are those of the package folder (an editable install's source tree too);
    METADATA, which carries the dependencies and extras, and the entry points come from
    the installed distribution.
    """
    try:
        dist = importlib.metadata.distribution("gpu-share")
    except importlib.metadata.PackageNotFoundError as exc:
        raise NotFound(
            "this coordinator runs gpu_share without an installed distribution, so it has "
            "no wheel to serve; install it (`pip install .`) or use install.sh --package"
        ) from exc
    metadata = re.sub(
        r"^Version: .*$",
        f"Version: {__version__}",
        dist.read_text("METADATA") or "",
        count=1,
        flags=re.MULTILINE,
    )
    dist_info = f"gpu_share-{__version__.replace('-', '_')}.dist-info"
    members: list[tuple[str, bytes]] = []
    package = Path(gpu_share.__file__).parent
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package)
        if path.is_file() and not _skipped(relative):
            members.append((f"gpu_share/{relative.as_posix()}", path.read_bytes()))
    members.append((f"{dist_info}/METADATA", metadata.encode()))
    members.append((f"{dist_info}/WHEEL", _WHEEL_FILE.encode()))
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        members.append((f"{dist_info}/entry_points.txt", entry_points.encode()))
    record = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in members]
    record.append(f"{dist_info}/RECORD,,")
    members.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{threading.get_ident()}.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    partial.replace(target)


_WHEEL_FILE = "Wheel-Version: 1.0\nGenerator: gpu-share\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _skipped(relative: Path) -> bool:
    return (
        "__pycache__" in relative.parts
        or relative.suffix in (".pyc", ".pyo")
        or any(part.startswith(".") for part in relative.parts)
    )


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
