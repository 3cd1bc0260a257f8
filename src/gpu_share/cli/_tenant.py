"""What the tenant commands share: connection options, output, and exit codes.

Exit codes (also in `gpu-share --help`):
    0  done
    1  the operation failed: an invoke failed or timed out, a doctor check failed,
       the server refused the request (e.g. 404, 409, 503 NO_CAPACITY)
    2  usage or configuration: bad arguments, no base URL, a key the server refuses,
       a request the server found invalid (422), a missing local file
    3  the server could not be reached, or what answered is not a GPU Share server
  130  interrupted (Ctrl+C); an invoke being waited for goes on

The SDK is imported inside the commands, never at import time, so `gpu-share --help`
and the server and agent commands pay nothing for it.
"""

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from gpu_share.sdk import Client

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl+C

EXIT_CODES_HELP = """exit codes:
    0  done
    1  the operation failed (an invoke failed, a doctor check failed, the server refused)
    2  usage or configuration error (arguments, base URL, API key, invalid request)
    3  the server could not be reached (or is not a GPU Share server)
  130  interrupted (Ctrl+C); an invoke being waited for goes on

configuration: --base-url / GPU_SHARE_BASE_URL, --api-key / GPU_SHARE_API_KEY"""


def common_options() -> argparse.ArgumentParser:
    """The options every tenant command takes, after the command name."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("connection")
    group.add_argument(
        "--base-url", help="the server, e.g. http://127.0.0.1:8080 (default: GPU_SHARE_BASE_URL)"
    )
    group.add_argument("--api-key", help="your tenant key gpu_sk_… (default: GPU_SHARE_API_KEY)")
    group.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout, for scripts"
    )
    return parent


def add_command(
    sub: Any,
    name: str,
    command: "Callable[[argparse.Namespace, Client, Output], int]",
    *,
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=description or help[0].upper() + help[1:] + ".",
        parents=[common_options()],
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=lambda args: run_tenant_command(args, command))
    return parser


class Output:
    """Human text by default; with `--json` exactly one JSON document on stdout."""

    def __init__(
        self, as_json: bool, stdout: TextIO | None = None, stderr: TextIO | None = None
    ) -> None:
        self.as_json = as_json
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr

    def result(self, human: str | None, data: Any) -> None:
        if self.as_json:
            self.stdout.write(json.dumps(to_jsonable(data), indent=2) + "\n")
        elif human is not None:
            self.stdout.write(human.rstrip("\n") + "\n")
        self.stdout.flush()

    def note(self, text: str) -> None:
        """Progress for people; silent in JSON mode."""
        if not self.as_json:
            self.stderr.write(text.rstrip("\n") + "\n")
            self.stderr.flush()

    def error(self, message: str, *, kind: str, code: str | None = None, **extra: Any) -> None:
        if self.as_json:
            body = {"error": {"type": kind, "code": code, "message": message, **extra}}
            self.stdout.write(json.dumps(to_jsonable(body), indent=2) + "\n")
            self.stdout.flush()
        else:
            self.stderr.write(f"gpu-share: {message}\n")
            self.stderr.flush()


def to_jsonable(data: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list | tuple):
        return [to_jsonable(item) for item in data]
    if isinstance(data, dict):
        return {key: to_jsonable(value) for key, value in data.items()}
    return data


def connect(args: argparse.Namespace) -> "Client":
    from gpu_share.sdk import Client

    return Client(args.base_url, args.api_key, poll_interval=getattr(args, "poll_interval", None))


def run_tenant_command(
    args: argparse.Namespace, command: "Callable[[argparse.Namespace, Client, Output], int]"
) -> int:
    """Run one command with a client; every SDK exception becomes a message and an exit code."""
    from gpu_share.sdk import errors

    out = Output(args.json)
    try:
        with connect(args) as client:
            return command(args, client, out)
    except errors.ConfigurationError as exc:
        out.error(str(exc), kind="ConfigurationError")
        return EXIT_USAGE
    except (errors.ServerUnreachable, errors.UnexpectedResponse) as exc:
        out.error(str(exc), kind=type(exc).__name__)
        return EXIT_UNREACHABLE
    except (errors.Unauthorized, errors.Forbidden) as exc:
        out.error(
            f"{exc}; check --api-key or GPU_SHARE_API_KEY (a tenant key starts with gpu_sk_)",
            kind=type(exc).__name__,
            code=exc.code,
        )
        return EXIT_USAGE
    except (errors.ValidationError, errors.ChecksumMismatch) as exc:
        out.error(str(exc), kind=type(exc).__name__, code=exc.code, details=exc.details)
        return EXIT_USAGE
    except errors.ApiError as exc:
        out.error(str(exc), kind=type(exc).__name__, code=exc.code, details=exc.details)
        return EXIT_FAILED
    except errors.InvokeFailed as exc:
        out.error(
            str(exc),
            kind=type(exc).__name__,
            code=exc.code,
            invoke=exc.invoke,
            logs_tail=exc.logs_tail,
        )
        return EXIT_FAILED
    except errors.InvokeError as exc:
        out.error(str(exc), kind=type(exc).__name__, invoke_id=exc.invoke_id)
        return EXIT_FAILED
    except errors.GpuShareError as exc:
        out.error(str(exc), kind=type(exc).__name__)
        return EXIT_FAILED
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        out.error(str(exc), kind=type(exc).__name__)
        return EXIT_USAGE
