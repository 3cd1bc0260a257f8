"""`gpu-share invoke`, `status`, `logs` and `cancel`: run a job and follow it."""

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_share.cli._tenant import EXIT_INTERRUPTED, EXIT_OK, Output, add_command

if TYPE_CHECKING:
    from gpu_share.protocol.invokes import Invoke
    from gpu_share.sdk import Client, InvokeOutputs

SHOW_VALUES_UP_TO = 32  # elements; larger arrays are summarised by dtype and shape


def register(sub: Any) -> None:
    invoke_parser = add_command(
        sub,
        "invoke",
        invoke,
        help="run a job: local files are uploaded first; --wait follows it to the end",
        description="Run a model (ONNX) or a training config (CatBoost). --model and "
        "--inputs take a URL or a local file (uploaded first, reused when identical). "
        "Without --inputs, an ONNX model runs on one zero-filled batch.",
    )
    invoke_parser.add_argument(
        "--runtime",
        required=True,
        choices=["onnx_cuda", "onnx_cpu", "catboost_cuda", "catboost_cpu"],
    )
    invoke_parser.add_argument("--model", required=True, help="URL or file: .onnx or config")
    invoke_parser.add_argument("--inputs", default="", help="URL or file: an NPZ")
    invoke_parser.add_argument("--timeout-sec", type=int, help="kill the job after this long")
    invoke_parser.add_argument("--priority", choices=["on_demand", "spot"])
    invoke_parser.add_argument("--gpu-model", help="e.g. 'H100'")
    invoke_parser.add_argument("--gpus", type=int, help="GPUs on one node")
    invoke_parser.add_argument("--min-vram-gb", type=float)
    invoke_parser.add_argument("--region")
    invoke_parser.add_argument("--tier", choices=["enterprise", "community"])
    invoke_parser.add_argument("--max-price-per-gpu-hour", help="USDC")
    invoke_parser.add_argument(
        "--reservation-id", help="run in this active reservation of yours (rsv_…)"
    )
    invoke_parser.add_argument(
        "--require-verified",
        action="store_true",
        default=None,
        help="only on nodes whose hardware is proven by hardware challenges",
    )
    invoke_parser.add_argument("--idempotency-key", help="send the same key to never run twice")
    _add_wait_options(invoke_parser)

    status_parser = add_command(
        sub,
        "status",
        status,
        help="show an invoke's status and result; --wait follows it to the end",
    )
    status_parser.add_argument("invoke_id")
    _add_wait_options(status_parser)

    logs_parser = add_command(sub, "logs", logs, help="print an invoke's log")
    logs_parser.add_argument("invoke_id")
    logs_parser.add_argument(
        "--follow", "-f", action="store_true", help="keep printing until the invoke ends"
    )
    logs_parser.add_argument(
        "--poll-interval", type=float, default=1.0, help="with --follow (default 1 s)"
    )

    cancel_parser = add_command(sub, "cancel", cancel, help="cancel a queued or running invoke")
    cancel_parser.add_argument("invoke_id")


def _add_wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait", action="store_true", help="wait for the end, showing the status as it changes"
    )
    parser.add_argument(
        "--wait-timeout", type=float, help="stop waiting after this many seconds (job goes on)"
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        help="with --wait: seconds between status updates (default 5, up to 10); the end "
        "shows at once",
    )
    parser.add_argument(
        "--output", type=Path, help="with --wait: write the outputs file (NPZ) here"
    )


def _options(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "timeout_sec",
        "priority",
        "gpu_model",
        "gpus",
        "min_vram_gb",
        "region",
        "tier",
        "max_price_per_gpu_hour",
        "reservation_id",
        "require_verified",
        "idempotency_key",
    )
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _stage(client: "Client", value: str, kind: str) -> tuple[str, str | None]:
    """A URL as it is; a local file uploaded (or reused), with its checksum."""
    if not value or value.startswith(("http://", "https://")):
        return value, None
    artifact = client.upload_artifact(value, kind)
    return artifact.url, artifact.sha256


def summary(invoke: "Invoke") -> str:
    lines = [f"{invoke.id}  {invoke.status.value}  {invoke.runtime.value}"]
    lines.append(f"node:     {invoke.node_id or '-'} (attempts: {invoke.attempts})")
    lines.append(f"created:  {invoke.created_at.isoformat()}")
    if invoke.finished_at:
        lines.append(f"finished: {invoke.finished_at.isoformat()}")
    if invoke.result is not None:
        m = invoke.result.metrics
        where = m.device + (f" ({m.execution_provider})" if m.execution_provider else "")
        queued = f", queued {m.queue_ms} ms" if m.queue_ms is not None else ""
        lines.append(f"ran on:   {where}, {m.duration_ms} ms{queued}")
        if invoke.result.outputs_url:
            lines.append(f"outputs:  {invoke.result.outputs_url}")
    if invoke.error is not None:
        lines.append(f"error:    {invoke.error.code}: {invoke.error.message}")
    if invoke.spot_checked:
        lines.append("checked:  its result was re-run on a trusted node and compared")
    if invoke.refund is not None:
        why = f": {invoke.refund.reason}" if invoke.refund.reason else ""
        lines.append(f"refunded: {invoke.refund.at.isoformat()}{why}")
    lines += [f"warning:  {w}" for w in invoke.warnings]
    return "\n".join(lines)


def _arrays(outputs: "InvokeOutputs") -> tuple[list[str], dict[str, Any]]:
    """Lines for people and a JSON-able description of the output arrays."""
    if outputs.raw is None:
        return [f"outputs are in your storage: {outputs.url}"], {}
    try:
        arrays = outputs.arrays
    except Exception as exc:  # numpy missing, or not an NPZ: the bytes still are the result
        return [f"outputs: {len(outputs.raw)} bytes ({exc}); use --output FILE to keep them"], {}
    lines, described = [], {}
    for name, array in arrays.items():
        entry: dict[str, Any] = {"dtype": str(array.dtype), "shape": list(array.shape)}
        text = f"{name}: {array.dtype}{list(array.shape)}"
        if array.size <= SHOW_VALUES_UP_TO:
            entry["values"] = array.tolist()
            text += f" = {array.tolist()}"
        lines.append(text)
        described[name] = entry
    return lines, described


def invoke(args: argparse.Namespace, client: "Client", out: Output) -> int:
    from gpu_share.protocol.runtimes import RuntimeName

    # A CatBoost training's model is its train config, uploaded as one.
    model_kind = RuntimeName(args.runtime).model_kind.value
    model_url, model_sha = _stage(client, args.model, model_kind)
    inputs_url, inputs_sha = _stage(client, args.inputs, "inputs")
    options = _options(args)
    if model_sha:
        options["model_checksum_sha256"] = model_sha
    if inputs_sha:
        options["inputs_checksum_sha256"] = inputs_sha
    # With --wait the submit itself holds for the first status window (`Prefer: wait`):
    # a short job is answered finished, with no status request after it.
    wait = client.config.poll_interval if args.wait else 0.0
    if args.wait_timeout is not None:  # as invoke_and_wait: never hold past the timeout
        wait = min(wait, args.wait_timeout)
    queued = client.invoke(args.runtime, model_url, inputs_url, wait=wait, **options)
    if not args.wait:
        out.result(
            f"{queued.id}  {queued.status.value}\nfollow it: gpu-share status {queued.id} --wait",
            queued,
        )
        return EXIT_OK
    return _follow(args, client, out, queued)


def status(args: argparse.Namespace, client: "Client", out: Output) -> int:
    if args.wait:
        return _follow(args, client, out, args.invoke_id)
    current = client.get_invoke(args.invoke_id)
    out.result(summary(current), current)
    return EXIT_OK


def _follow(args: argparse.Namespace, client: "Client", out: Output, invoke: "Invoke | str") -> int:
    """Wait for the end and print the outputs; Ctrl+C stops the waiting, not the invoke."""
    invoke_id = invoke if isinstance(invoke, str) else invoke.id
    live_line = not args.json and client.config.progress is not False and sys.stderr.isatty()

    def changed(current: "Invoke") -> None:
        if not live_line:  # the SDK rewrites one status line on a terminal
            out.note(f"{current.id} {current.status.value}")

    try:
        final = client.wait(invoke, args.wait_timeout, on_status=changed)
    except KeyboardInterrupt:
        cancel = f"gpu-share cancel {invoke_id}"
        follow = f"gpu-share status {invoke_id} --wait"
        log = f"gpu-share logs {invoke_id} --follow"
        out.error(
            f"stopped waiting; invoke {invoke_id} goes on ({cancel} stops it)\n"
            f"  follow it: {follow}, or its log: {log}",
            kind="Interrupted",
            invoke_id=invoke_id,
        )
        return EXIT_INTERRUPTED
    outputs = client.outputs(final)
    if args.output is not None and outputs.raw is not None:
        args.output.write_bytes(outputs.raw)
    lines, described = _arrays(outputs)
    if args.output is not None and outputs.raw is not None:
        lines.append(f"outputs written to {args.output}")
    out.result("\n".join([summary(final), *lines]), {"invoke": final, "outputs": described})
    return EXIT_OK


def logs(args: argparse.Namespace, client: "Client", out: Output) -> int:
    if not args.follow:
        text = client.logs(args.invoke_id)
        if args.json:
            out.result(None, {"invoke_id": args.invoke_id, "logs": text})
        else:
            out.stdout.write(text)
            out.stdout.flush()
        return EXIT_OK
    pieces = []
    for piece in client.follow_logs(args.invoke_id, poll_interval=args.poll_interval):
        pieces.append(piece)
        if not args.json:
            out.stdout.write(piece)
            out.stdout.flush()
    if args.json:
        out.result(None, {"invoke_id": args.invoke_id, "logs": "".join(pieces)})
    return EXIT_OK


def cancel(args: argparse.Namespace, client: "Client", out: Output) -> int:
    current = client.cancel(args.invoke_id)
    human = f"{current.id}  {current.status.value}"
    if not current.status.terminal:
        human += "  (cancel requested; its node stops it shortly)"
    out.result(human, current)
    return EXIT_OK
