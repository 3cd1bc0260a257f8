"""The machine's fingerprint (agent/fingerprint.py): the same machine gives the same one on
every start, whatever order NVML lists its GPUs in; another machine, other GPUs or another
installation give another. An agent that lost its identity file registers as its node again."""

import platform
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.agent.fingerprint import cpu_model, machine_fingerprint, machine_id
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.testing.factories import ProviderHandle
from tests.agent.test_gpu_leases import make_agent

UUIDS = ["GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"]


def facts(tmp_path: Path, machine: str = "4f1c0e", cpu: str = "AMD EPYC 9654") -> dict[str, Path]:
    etc = tmp_path / f"etc-{machine}"
    etc.mkdir(exist_ok=True)
    (etc / "machine-id").write_text(f"{machine}\n")
    (etc / "cpuinfo").write_text(f"processor\t: 0\nmodel name\t: {cpu}\nflags\t\t: fpu\n")
    return {"ids": etc / "machine-id", "cpuinfo": etc / "cpuinfo"}


def fingerprint(tmp_path: Path, uuids: list[str], data_dir: Path, **kw: str) -> str:
    found = facts(tmp_path, **kw)
    return machine_fingerprint(
        gpu_uuids=uuids,
        data_dir=data_dir,
        machine_id_files=[found["ids"]],
        cpuinfo=found["cpuinfo"],
    )


def test_the_same_facts_give_the_same_fingerprint_whatever_order_the_gpus_come_in(
    tmp_path: Path,
) -> None:
    data = tmp_path / "agent"
    first = fingerprint(tmp_path, UUIDS, data)
    assert len(first) == 64 and int(first, 16) >= 0
    assert fingerprint(tmp_path, list(reversed(UUIDS)), data) == first
    assert fingerprint(tmp_path, UUIDS, tmp_path / "." / "agent") == first  # the same folder


def test_another_machine_other_gpus_or_another_installation_give_another(tmp_path: Path) -> None:
    data = tmp_path / "agent"
    first = fingerprint(tmp_path, UUIDS, data)
    others = {
        fingerprint(tmp_path, UUIDS, data, machine="9d2e77"),
        fingerprint(tmp_path, UUIDS[:1], data),
        fingerprint(tmp_path, UUIDS, data, cpu="Intel Xeon Platinum 8480+"),
        fingerprint(tmp_path, UUIDS, tmp_path / "second-agent"),
    }
    assert first not in others and len(others) == 4


def test_what_cannot_be_read_is_left_out_not_an_error(tmp_path: Path) -> None:
    assert machine_id([tmp_path / "missing", tmp_path / "also-missing"]) is None
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert machine_id([empty]) is None
    assert cpu_model(facts(tmp_path)["cpuinfo"]) == "AMD EPYC 9654"
    assert cpu_model(tmp_path / "no-cpuinfo") == (
        platform.processor() or platform.machine() or None
    )
    stable = machine_fingerprint(
        gpu_uuids=[], data_dir=tmp_path, machine_id_files=[tmp_path / "missing"]
    )
    assert stable == machine_fingerprint(
        gpu_uuids=[""], data_dir=tmp_path, machine_id_files=[tmp_path / "missing"]
    )


async def test_an_agent_that_lost_its_identity_registers_as_its_node_again(
    app: FastAPI, provider: ProviderHandle, tmp_path: Path
) -> None:
    first = make_agent(tmp_path, app, provider.enrollment_token)
    await first.connect()
    node_id = first.node_id
    await first.client.aclose()

    first.settings.identity_path.unlink()  # reinstalled, or its state wiped
    again = make_agent(tmp_path, app, provider.enrollment_token)
    assert again.inventory().fingerprint == first.inventory().fingerprint  # stable across starts
    await again.connect()
    assert again.node_id == node_id
    async with app.state.replica.db.read() as session:
        rows = (await session.scalars(select(NodeRow))).all()
    assert [(r.id, r.fingerprint) for r in rows] == [(node_id, first.fingerprint)]
    await again.client.aclose()
