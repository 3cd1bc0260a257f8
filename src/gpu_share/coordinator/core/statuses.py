"""The status sets that queries filter on, as the rows store them.

Each is a wire enum's set (`protocol`) turned into the stored strings, sorted so a
statement built from it is the same every time. The rules that move a row between
statuses have one owner each (`services/work/invoke_state.py`, `services/sessions/`,
`services/rentals/`); these are only the vocabulary every domain reads with.
"""

from enum import StrEnum

from gpu_share.protocol.invokes import ACTIVE
from gpu_share.protocol.reservations import ReservationStatus
from gpu_share.protocol.sessions import OPEN_SESSION_STATUSES

ACTIVE_VALUES = sorted(s.value for s in ACTIVE)
"""Invokes a node holds: assigned or running."""

OPEN_SESSION_VALUES = sorted(s.value for s in OPEN_SESSION_STATUSES)
"""Sessions that hold their node: starting or ready."""

LIVE = (ReservationStatus.PENDING.value, ReservationStatus.ACTIVE.value)
"""Reservations not over: booked ahead, or in their period."""


class CheckState(StrEnum):
    """`InvokeRow.check_state` of an invoke that ran on an untrusted node (docs/trust.md,
    "Spot checks"). None: not decided yet. A check invoke (`check_of` set) keeps the
    verdict it gave in its own `check_state` once it is concluded, None till then."""

    PENDING = "pending"  # picked: its check waits for a trusted node or runs
    CONFIRMING = "confirming"  # the check disagreed: a second one runs before anything happens
    MATCH = "match"
    MISMATCH = "mismatch"  # confirmed: the node was caught
    INCONCLUSIVE = "inconclusive"  # no trusted node took it, or the checks could not tell
    SKIPPED = "skipped"  # not picked (or not checkable: outputs the platform never saw)


CHECK_UNDER_WAY = frozenset({CheckState.PENDING.value, CheckState.CONFIRMING.value})
"""Its check has not come back."""

CHECK_CAME_BACK = frozenset({CheckState.MATCH.value, CheckState.MISMATCH.value})
"""Its result was recomputed on a trusted node and compared (an invoke's `spot_checked`)."""
