"""Entry point: `gpu-share <command>`. Each command lives in its own module."""

import argparse
import sys
from collections.abc import Sequence

from gpu_share._version import __version__
from gpu_share.cli import (
    agent,
    discovery,
    doctor,
    invokes,
    reservations,
    server,
    sessions,
    up,
    upload,
)
from gpu_share.cli._tenant import EXIT_CODES_HELP

# Tenant commands first: they are what most people run.
COMMANDS = (doctor, discovery, upload, invokes, sessions, reservations, server, agent, up)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-share",
        description="GPU Share: ONNX inference and CatBoost training on remote GPUs",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpu-share {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
