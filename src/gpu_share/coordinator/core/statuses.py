"""The status sets that queries filter on, as the rows store them.

Each is a wire enum's set (`protocol`) turned into the stored strings, sorted so a
statement built from it is the same every time. The rules that move a row between
statuses have one owner each (`services/work/invoke_state.py`, `services/sessions/`,
`services/rentals/`); these are only the vocabulary every domain reads with.
"""

from gpu_share.protocol.invokes import ACTIVE
from gpu_share.protocol.reservations import ReservationStatus
from gpu_share.protocol.sessions import OPEN_SESSION_STATUSES

ACTIVE_VALUES = sorted(s.value for s in ACTIVE)
"""Invokes a node holds: assigned or running."""

OPEN_SESSION_VALUES = sorted(s.value for s in OPEN_SESSION_STATUSES)
"""Sessions that hold their node: starting or ready."""

LIVE = (ReservationStatus.PENDING.value, ReservationStatus.ACTIVE.value)
"""Reservations not over: booked ahead, or in their period."""
