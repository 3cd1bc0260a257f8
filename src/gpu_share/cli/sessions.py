"""`gpu-share session`: load a model once, run several inputs through it, close it."""

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_share.cli._tenant import EXIT_OK, Output, add_command

if TYPE_CHECKING:
    from gpu_share.sdk import Client

SHOW_VALUES_UP_TO = 32


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "session",
        session,
        help="load an ONNX model on a node and run inputs through it at low latency",
        description="Open a session (the model stays loaded on one node), forward each "
        "--inputs NPZ file through it in order, print or save the outputs, and close it. "
        "Each forward's latency is shown.",
    )
    parser.add_argument("--runtime", default="onnx_cuda", choices=["onnx_cuda", "onnx_cpu"])
    parser.add_argument("--model", required=True, help="URL or .onnx file (uploaded first)")
    parser.add_argument(
        "--inputs", action="append", required=True, type=Path, help="NPZ file; repeat for more"
    )
    parser.add_argument("--output-dir", type=Path, help="write <inputs name>.out.npz files here")
    parser.add_argument("--idle-timeout-sec", type=int, default=60)
    parser.add_argument("--max-batch", type=int)
    parser.add_argument("--reservation-id", help="hold the model in this active reservation")
    parser.add_argument(
        "--require-verified",
        action="store_true",
        help="only on a node whose hardware is proven by hardware challenges",
    )


def _describe(arrays: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    lines, described = [], {}
    for name, array in arrays.items():
        entry: dict[str, Any] = {"dtype": str(array.dtype), "shape": list(array.shape)}
        text = f"  {name}: {array.dtype}{list(array.shape)}"
        if array.size <= SHOW_VALUES_UP_TO:
            entry["values"] = array.tolist()
            text += f" = {array.tolist()}"
        lines.append(text)
        described[name] = entry
    return lines, described


def session(args: argparse.Namespace, client: "Client", out: Output) -> int:
    from gpu_share.sdk import _npz

    options: dict[str, Any] = {"idle_timeout_sec": args.idle_timeout_sec}
    if args.max_batch is not None:
        options["max_batch"] = args.max_batch
    if args.reservation_id is not None:
        options["reservation_id"] = args.reservation_id
    if args.require_verified:
        options["require_verified"] = True
    lines: list[str] = []
    forwards: list[dict[str, Any]] = []
    with client.session(args.model, runtime=args.runtime, **options) as handle:
        lines.append(f"{handle.id}  ready on {handle.info.node_id} ({handle.info.device})")
        out.note(lines[-1])
        for path in args.inputs:
            inputs = _npz.decode(path.read_bytes())
            started = time.perf_counter()
            outputs = handle.forward(inputs)
            latency_ms = (time.perf_counter() - started) * 1000
            shown, described = _describe(outputs)
            lines += [f"{path}: {latency_ms:.1f} ms", *shown]
            record: dict[str, Any] = {"inputs": str(path), "ms": latency_ms, "outputs": described}
            if args.output_dir is not None:
                args.output_dir.mkdir(parents=True, exist_ok=True)
                target = args.output_dir / f"{path.stem}.out.npz"
                target.write_bytes(_npz.encode(outputs))
                record["written"] = str(target)
                lines.append(f"  written to {target}")
            forwards.append(record)
    lines.append(f"{handle.id}  closed")
    out.result("\n".join(lines), {"session": handle.info, "forwards": forwards})
    return EXIT_OK
