"""`gpu-share reservations quote|create|list|show|cancel`: dedicated GPUs for a period."""

import argparse
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpu_share.cli._tenant import EXIT_OK, Output, add_command
from gpu_share.cli.discovery import table

if TYPE_CHECKING:
    from gpu_share.protocol.reservations import Reservation, ReservationQuote
    from gpu_share.sdk import Client

# The `ReservationRequest` fields the options fill, by their option's dest.
REQUEST_FIELDS = (
    "node_id",
    "gpus",
    "starts_at",
    "ends_at",
    "hours",
    "gpu_model",
    "min_vram_gb",
    "region",
    "tier",
    "max_price",
    "min_reliability",
    "require_verified",
)


def register(sub: Any) -> None:
    group = sub.add_parser(
        "reservations",
        help="reserve whole GPUs of one node for a period: quote, create, list, show, cancel",
        description="Dedicated reservations: whole GPUs of one node, held for you from a start "
        "(now, or a whole minute up to 90 days ahead) for whole hours (1 to 720). The period's "
        "price is taken from your balance when you reserve. Run work in a reservation with "
        "`gpu-share invoke … --reservation-id rsv_…` (or `session`).",
    )
    commands = group.add_subparsers(
        dest="reservations_command", metavar="SUBCOMMAND", required=True
    )

    quote_parser = add_command(
        commands,
        "quote",
        quote,
        help="the node, GPUs and price a reservation would get now; reserves nothing",
    )
    _add_request_options(quote_parser)
    create_parser = add_command(
        commands,
        "create",
        create,
        help="reserve: the period's price moves from your balance now",
    )
    _add_request_options(create_parser)
    list_parser = add_command(commands, "list", list_, help="your reservations, newest first")
    list_parser.add_argument("--limit", type=int, default=100, help="at most this many (1-200)")
    show_parser = add_command(commands, "show", show, help="show one reservation")
    show_parser.add_argument("reservation_id")
    cancel_parser = add_command(
        commands,
        "cancel",
        cancel,
        help="cancel: free before it starts; once started every hour begun is charged",
    )
    cancel_parser.add_argument("reservation_id")


def _add_request_options(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to reserve (a node, or filters for the best one)")
    what.add_argument("--node-id", "--node", dest="node_id", help="this node (nod_…)")
    what.add_argument("--gpus", type=int, help="whole GPUs of one node (default 1)")
    what.add_argument("--gpu-model", help="e.g. 'H100'")
    what.add_argument("--min-vram-gb", type=float)
    what.add_argument("--region")
    what.add_argument("--tier", choices=["enterprise", "community"])
    what.add_argument("--max-price", help="USDC per GPU-hour")
    what.add_argument("--min-reliability", type=float, help="0 to 1")
    what.add_argument(
        "--require-verified",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only a node whose hardware is all proven by hardware challenges (default); "
        "--no-require-verified also allows one with other GPUs not proven yet (the reserved "
        "GPUs are proven either way)",
    )
    when = parser.add_argument_group("when (UTC)")
    when.add_argument(
        "--starts-at",
        "--start",
        dest="starts_at",
        help="a whole minute, e.g. 2026-12-03T10:00:00Z (default: now)",
    )
    when.add_argument("--hours", type=int, help="the period's length in whole hours")
    when.add_argument("--ends-at", "--end", dest="ends_at", help="instead of --hours")


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in REQUEST_FIELDS if getattr(args, name) is not None}


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _period(starts_at: datetime, ends_at: datetime, hours: int) -> str:
    return f"{_when(starts_at)} to {_when(ends_at)} ({hours} h)"


def quote_summary(quoted: "ReservationQuote") -> str:
    if quoted.available is None:
        balance = "free billing: nothing is charged"
    elif quoted.covered:
        balance = f"{quoted.available} USDC available: covered"
    else:
        balance = f"{quoted.available} USDC available: not covered, top up first"
    return "\n".join(
        [
            f"node:     {quoted.node_id} ({quoted.gpus} x {quoted.gpu_model})",
            f"period:   {_period(quoted.starts_at, quoted.ends_at, quoted.hours)}",
            f"rate:     {quoted.rate_per_gpu_hour} USDC/GPU-hour, {quoted.rate_per_hour} USDC/hour",
            f"cost:     {quoted.cost} USDC, taken from the balance when reserved",
            f"balance:  {balance}",
        ]
    )


def summary(reservation: "Reservation") -> str:
    gpus = ", ".join(str(index) for index in sorted(reservation.gpu_indices))
    charged = " (what was charged)" if reservation.canceled_at is not None else ""
    lines = [
        f"{reservation.id}  {reservation.status.value}",
        f"node:     {reservation.node_id} ({reservation.gpus} GPU(s): {gpus})",
        f"period:   {_period(reservation.starts_at, reservation.ends_at, reservation.hours)}",
        f"rate:     {reservation.rate_per_hour} USDC/hour",
        f"cost:     {reservation.cost} USDC{charged}",
        f"created:  {_when(reservation.created_at)}",
    ]
    if reservation.canceled_at is not None:
        lines.append(f"canceled: {_when(reservation.canceled_at)}")
    return "\n".join(lines)


def quote(args: argparse.Namespace, client: "Client", out: Output) -> int:
    quoted = client.quote_reservation(**_fields(args))
    out.result(quote_summary(quoted), quoted)
    return EXIT_OK


def create(args: argparse.Namespace, client: "Client", out: Output) -> int:
    made = client.reserve(**_fields(args))
    hint = f"run in it: gpu-share invoke … --reservation-id {made.id}"
    out.result(f"{summary(made)}\n{hint}", made)
    return EXIT_OK


def list_(args: argparse.Namespace, client: "Client", out: Output) -> int:
    page = client.reservations(limit=args.limit)
    rows = [["RESERVATION", "STATUS", "NODE", "GPUS", "STARTS", "ENDS", "HOURS", "COST USDC"]]
    for r in page.items:
        rows.append(
            [
                r.id,
                r.status.value,
                r.node_id,
                str(r.gpus),
                _when(r.starts_at),
                _when(r.ends_at),
                str(r.hours),
                r.cost,
            ]
        )
    human = table(rows) if page.items else "no reservations yet: gpu-share reservations quote …"
    out.result(human, page.items)
    return EXIT_OK


def show(args: argparse.Namespace, client: "Client", out: Output) -> int:
    found = client.get_reservation(args.reservation_id)
    out.result(summary(found), found)
    return EXIT_OK


def cancel(args: argparse.Namespace, client: "Client", out: Output) -> int:
    canceled = client.cancel_reservation(args.reservation_id)
    out.result(summary(canceled), canceled)
    return EXIT_OK
