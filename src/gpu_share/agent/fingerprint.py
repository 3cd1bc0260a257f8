"""The machine's fingerprint: how the coordinator knows this machine when it registers
again (docs/operations.md, "Machine identity").

A SHA-256 over facts that stay put while the machine does: the OS's machine id, the GPUs'
UUIDs (sorted: NVML's order may change), the CPU model, and the agent's data directory
(one installation on one machine is one node; two agents on one machine, each with its
own directory, are two). Nothing that changes from one start to the next (hostname,
driver, free memory) is in it. The coordinator also matches each GPU UUID on its own,
so a machine whose OS was reinstalled is still known by its GPUs.
"""

import hashlib
import json
import platform
from collections.abc import Iterable, Sequence
from pathlib import Path

MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
CPUINFO = Path("/proc/cpuinfo")


def machine_id(files: Sequence[Path] = MACHINE_ID_FILES) -> str | None:
    """The OS's id of this installation (systemd, D-Bus); None where there is none (a
    container without one: the other facts then tell machines apart)."""
    for path in files:
        try:
            value = path.read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return None


def cpu_model(cpuinfo: Path = CPUINFO) -> str | None:
    """The CPU's model name as the kernel reports it, else what Python can say."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def machine_fingerprint(
    *,
    gpu_uuids: Iterable[str],
    data_dir: Path,
    machine_id_files: Sequence[Path] = MACHINE_ID_FILES,
    cpuinfo: Path = CPUINFO,
) -> str:
    facts = {
        "machine_id": machine_id(machine_id_files),
        "gpus": sorted({uuid for uuid in gpu_uuids if uuid}),
        "cpu": cpu_model(cpuinfo),
        "data_dir": str(data_dir.resolve()),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
