"""`gpu-share doctor`: the seed's checklist as one command, one line per check.

Server reachable → health → key valid → nodes online → runtimes → a smoke invoke
(the bundled digits model on one zero-filled batch). Each failing check says how to
fix it, and the checks after a failure that makes them moot are skipped.
"""

import argparse
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from gpu_share.cli._tenant import (
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Output,
    common_options,
)

if TYPE_CHECKING:
    from gpu_share.sdk import Client

MARKS = {"ok": "[ok]  ", "fail": "[FAIL]", "skip": "[skip]", "warn": "[warn]"}


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "doctor",
        help="check the server, your key, nodes, runtimes and a smoke invoke",
        description="Check that you can use GPU Share: the server answers, it is healthy, "
        "your key is accepted, nodes are online, runtimes are served, and a smoke invoke "
        "(the bundled digits model, one zero-filled batch) runs. One line per check; "
        "each failure says how to fix it.",
        parents=[common_options()],
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--runtime",
        choices=["onnx_cuda", "onnx_cpu"],
        help="runtime of the smoke invoke (default: onnx_cuda when served, else onnx_cpu)",
    )
    parser.add_argument("--skip-invoke", action="store_true", help="do not run the smoke invoke")
    parser.add_argument(
        "--invoke-timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the smoke invoke (default 120)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        help="seconds between status updates of the smoke invoke; its end shows at once",
    )
    parser.set_defaults(run=run)


@dataclass
class Check:
    name: str
    status: str  # ok | fail | skip | warn
    detail: str
    fix: str | None = None


class Doctor:
    def __init__(self, out: Output) -> None:
        self.out = out
        self.checks: list[Check] = []

    def report(self, name: str, status: str, detail: str, fix: str | None = None) -> bool:
        check = Check(name, status, detail, fix)
        self.checks.append(check)
        if not self.out.as_json:
            line = f"{MARKS[status]} {name:<17} {detail}"
            if fix:
                line += f"\n       fix: {fix}"
            self.out.stdout.write(line + "\n")
            self.out.stdout.flush()
        return status in ("ok", "warn")

    def skip(self, *names: str, because: str) -> None:
        for name in names:
            self.report(name, "skip", because)

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)


LATER = ("health", "API key", "nodes online", "runtimes", "smoke invoke")


def run(args: argparse.Namespace) -> int:
    from gpu_share.sdk import Client, RetryPolicy, errors

    out = Output(args.json)
    doctor = Doctor(out)
    try:
        client = Client(
            args.base_url,
            args.api_key,
            poll_interval=args.poll_interval,
            retry=RetryPolicy(max_attempts=2),  # a diagnosis should not wait out backoffs
        )
    except errors.ConfigurationError as exc:
        doctor.report("configuration", "fail", str(exc))
        return _finish(doctor, out, EXIT_USAGE)
    with client:
        code = _diagnose(args, client, doctor)
    return _finish(doctor, out, code)


def _finish(doctor: Doctor, out: Output, code: int) -> int:
    if out.as_json:
        out.result(None, {"ok": code == EXIT_OK, "checks": [asdict(c) for c in doctor.checks]})
    return code


def _diagnose(args: argparse.Namespace, client: "Client", doctor: Doctor) -> int:
    from gpu_share.sdk import errors

    base = client.base_url
    started = time.monotonic()
    try:
        health = client.health()
    except errors.ServerUnreachable as exc:
        doctor.report(
            "server reachable",
            "fail",
            f"no answer from {base}: {exc.reason}",
            "check --base-url / GPU_SHARE_BASE_URL and that the server runs "
            "(`gpu-share up` or `gpu-share server` serves http://127.0.0.1:8080)",
        )
        doctor.skip(*LATER, because="the server is unreachable")
        return EXIT_UNREACHABLE
    except (errors.UnexpectedResponse, errors.ApiError) as exc:
        doctor.report(
            "server reachable",
            "fail",
            f"{base} answered, but not as GPU Share: {exc}",
            "give the server's root URL, e.g. https://gpu-share.example (no /v1, no /docs)",
        )
        doctor.skip(*LATER, because="this is not a GPU Share server")
        return EXIT_UNREACHABLE
    elapsed = (time.monotonic() - started) * 1000
    doctor.report("server reachable", "ok", f"{base} answered in {elapsed:.0f} ms")
    if health.status == "ok":
        doctor.report("health", "ok", f"version {health.version}, database {health.database}")
    else:
        doctor.report(
            "health",
            "fail",
            f"status {health.status}, database {health.database}",
            "the server cannot reach its database; its operator should check it",
        )
    if not _key(client, doctor):
        doctor.skip("nodes online", "runtimes", "smoke invoke", because="no usable API key")
        return EXIT_USAGE
    served = _capacity(client, doctor)
    if args.skip_invoke:
        doctor.skip("smoke invoke", because="--skip-invoke")
    elif not served:
        doctor.skip("smoke invoke", because="no node online to run it")
    else:
        _smoke(args, client, doctor, served)
    return EXIT_FAILED if doctor.failed else EXIT_OK


def _key(client: "Client", doctor: Doctor) -> bool:
    from gpu_share.sdk import errors

    key = client.config.api_key
    if not key:
        return doctor.report(
            "API key",
            "fail",
            "no API key given",
            "pass --api-key gpu_sk_… or set GPU_SHARE_API_KEY; an admin issues tenant keys",
        )
    shown = f"{key[:10]}…"
    try:
        client.runtimes()
    except errors.Unauthorized:
        return doctor.report(
            "API key",
            "fail",
            f"{shown} is not accepted (unknown, mistyped or revoked)",
            "copy the key again, or ask your admin for a new tenant key (gpu_sk_…)",
        )
    except errors.Forbidden:
        return doctor.report(
            "API key",
            "fail",
            f"{shown} is not a tenant key",
            "use a tenant key (gpu_sk_…); provider and agent keys cannot run jobs",
        )
    return doctor.report("API key", "ok", f"{shown} accepted")


def _capacity(client: "Client", doctor: Doctor) -> list[str]:
    """Checks nodes and runtimes; returns the runtimes some online node serves."""
    nodes = client.nodes()
    online = [n for n in nodes if n.status.value in ("online", "busy")]
    if online:
        gpus = sum(len(n.gpus) for n in online)
        doctor.report("nodes online", "ok", f"{len(online)} of {len(nodes)} node(s), {gpus} GPU(s)")
    else:
        doctor.report(
            "nodes online",
            "fail",
            f"no node is online ({len(nodes)} known)",
            "wait for a provider to connect a machine, or connect one yourself: "
            "`gpu-share agent --server URL --token gpu_et_…` (or run `gpu-share up`)",
        )
    availability = client.runtimes()
    served = [r.name.value for r in availability if r.nodes_online > 0]
    missing = [r.name.value for r in availability if r.nodes_online == 0]
    if not served:
        doctor.report(
            "runtimes",
            "fail",
            "no runtime is served by an online node",
            "the same as for nodes: a machine running `gpu-share agent` must be online",
        )
    elif any(name.endswith("_cuda") for name in served):
        doctor.report("runtimes", "ok", ", ".join(served))
    else:
        doctor.report(
            "runtimes",
            "warn",
            f"{', '.join(served)}; no GPU runtime online ({', '.join(missing)})",
            "*_cuda invokes answer 503 NO_CAPACITY until a GPU node is online; "
            "use *_cpu runtimes meanwhile",
        )
    return served


def _smoke(args: argparse.Namespace, client: "Client", doctor: Doctor, served: list[str]) -> None:
    from gpu_share.examples import DIGITS_MODEL
    from gpu_share.sdk import errors

    runtime = args.runtime or ("onnx_cuda" if "onnx_cuda" in served else "onnx_cpu")
    if runtime not in served:
        doctor.report(
            "smoke invoke",
            "fail",
            f"no online node serves {runtime}",
            "pick another --runtime, or wait for a node that serves it",
        )
        return
    invoke_id = None
    try:
        model = client.upload_artifact(DIGITS_MODEL, "model")
        queued = client.invoke(
            runtime, model.url, "", model_checksum_sha256=model.sha256, timeout_sec=120
        )
        invoke_id = queued.id
        done = client.wait(queued, args.invoke_timeout)
    except errors.InvokeFailed as exc:
        doctor.report(
            "smoke invoke",
            "fail",
            f"{exc.invoke_id} {exc.status.value}: {exc.code}: {exc.message}",
            f"see the job's log: gpu-share logs {exc.invoke_id}",
        )
        return
    except errors.WaitTimeout as exc:
        doctor.report(
            "smoke invoke",
            "fail",
            f"{exc.invoke_id} still {exc.last_status} after {args.invoke_timeout:.0f} s",
            "the nodes may be busy: try again later, or raise --invoke-timeout; "
            f"the invoke goes on (gpu-share status {exc.invoke_id})",
        )
        return
    except errors.ApiError as exc:
        where = f" ({invoke_id})" if invoke_id else ""
        doctor.report("smoke invoke", "fail", f"{exc}{where}", _api_fix(exc))
        return
    assert done.result is not None
    metrics = done.result.metrics
    detail = f"{done.id} done on {metrics.device} in {metrics.duration_ms} ms ({runtime})"
    if runtime.endswith("_cuda") and metrics.device != "cuda":
        doctor.report(
            "smoke invoke", "warn", detail, "a *_cuda runtime ran on the CPU; report the node"
        )
    else:
        doctor.report("smoke invoke", "ok", detail)


def _api_fix(exc: Any) -> str:
    code = getattr(exc, "code", "")
    if code == "NO_CAPACITY":
        return "no node can take the job now; wait for a provider, or try a *_cpu runtime"
    if code in ("PAYLOAD_TOO_LARGE", "QUOTA_EXCEEDED"):
        return "delete artifacts you no longer need (GET/DELETE /v1/artifacts)"
    return "see the message; `gpu-share doctor --json` shows every check's details"
