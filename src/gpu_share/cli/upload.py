"""`gpu-share upload`: put a model, inputs or config on the platform, get its URL."""

import argparse
from typing import TYPE_CHECKING, Any

from gpu_share.cli._tenant import EXIT_OK, Output, add_command

if TYPE_CHECKING:
    from gpu_share.protocol.artifacts import Artifact
    from gpu_share.sdk import Client


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "upload",
        upload,
        help="upload a file as an artifact and print its URL for model_url / inputs_url",
        description="Upload a file (streamed, SHA-256 checked by the server, which refuses "
        "a file that is not what its kind says: an ONNX model, an NPZ of inputs, a CatBoost "
        "train config) under its file name. An identical live artifact of yours is reused "
        "instead of uploading again. Artifacts expire after 24 h by default.",
    )
    parser.add_argument("path", help="the file to upload")
    parser.add_argument(
        "--kind", required=True, choices=["model", "inputs", "config"], help="what the file is"
    )
    parser.add_argument(
        "--name",
        help="the name to show for it (default: the file's name, without its directory)",
    )
    parser.add_argument(
        "--no-reuse", action="store_true", help="upload even if an identical artifact exists"
    )


def describe(artifact: "Artifact") -> str:
    lines = [  # the id first on the first line: scripts take it with `cut -d' ' -f1`
        f"{artifact.id}  {artifact.kind.value}  {artifact.size} bytes  sha256 {artifact.sha256}",
        *([f"name:    {artifact.name}"] if artifact.name else []),
        f"url:     {artifact.url}",
        f"expires: {artifact.expires_at.isoformat()}",
    ]
    if artifact.signature is not None:  # a model: what an invoke feeds it and gets back
        more = ", …" if artifact.signature.truncated else ""
        for side, values in (
            ("inputs: ", artifact.signature.inputs),
            ("outputs:", artifact.signature.outputs),
        ):
            listed = ", ".join(value.describe() for value in values) or "none"
            lines.append(f"{side} {listed}{more}")
    return "\n".join(lines)


def upload(args: argparse.Namespace, client: "Client", out: Output) -> int:
    artifact = client.upload_artifact(args.path, args.kind, reuse=not args.no_reuse, name=args.name)
    out.result(describe(artifact), artifact)
    return EXIT_OK
