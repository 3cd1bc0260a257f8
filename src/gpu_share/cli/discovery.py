"""`gpu-share nodes`, `runtimes` and `probe-url`: what the platform offers right now."""

import argparse
from typing import TYPE_CHECKING, Any

from gpu_share.cli._tenant import EXIT_FAILED, EXIT_OK, Output, add_command

if TYPE_CHECKING:
    from gpu_share.sdk import Client


def register(sub: Any) -> None:
    add_command(sub, "nodes", nodes, help="list the nodes you may use: GPUs, runtimes, status")
    add_command(
        sub, "runtimes", runtimes, help="list the runtimes and how many online nodes serve each"
    )
    probe = add_command(
        sub,
        "probe-url",
        probe_url,
        help="check that a model or inputs URL is reachable by the platform's agents",
        description="Check a URL with the rules agents fetch with (public http(s) only). "
        "Exits 1 when it is not reachable.",
    )
    probe.add_argument("url")


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def nodes(args: argparse.Namespace, client: "Client", out: Output) -> int:
    found = client.nodes()
    rows = [
        ["NODE", "STATUS", "VERIFIED", "GPUS", "RUNTIMES", "REGION", "TIER", "USDC/GPU-H", "JOBS"]
    ]
    for node in found:
        gpus = ", ".join(
            f"{g.model} {g.vram_mb // 1024} GB{'' if g.verified else ' (unverified)'}"
            for g in node.gpus
        )
        rows.append(
            [
                node.id,
                node.status.value,
                "yes" if node.verified else "no",
                gpus or "CPU only",
                ",".join(r.value for r in node.runtimes),
                node.region or "-",
                node.tier.value,
                node.price_per_gpu_hour or "-",
                f"{node.running_jobs}/{node.max_concurrent_jobs}",
            ]
        )
    human = table(rows) if found else "no nodes yet: none has connected to this server"
    out.result(human, found)
    return EXIT_OK


def runtimes(args: argparse.Namespace, client: "Client", out: Output) -> int:
    found = client.runtimes()
    rows = [["RUNTIME", "KIND", "DEVICE", "NODES ONLINE"]]
    rows += [[r.name.value, r.kind, r.device, str(r.nodes_online)] for r in found]
    out.result(table(rows), found)
    return EXIT_OK


def probe_url(args: argparse.Namespace, client: "Client", out: Output) -> int:
    result = client.probe_url(args.url)
    if result.reachable:
        size = f"{result.content_length} bytes" if result.content_length is not None else "size ?"
        human = f"reachable: HTTP {result.status_code}, {size}, {result.content_type or '?'}"
    else:
        human = f"not reachable: {result.error or f'HTTP {result.status_code}'}"
    out.result(human, result)
    return EXIT_OK if result.reachable else EXIT_FAILED
