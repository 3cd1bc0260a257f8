"""Dedicated reservations (SPEC §4.3): booking whole GPUs of a node for a period
(`reservations`), charging and ending them (`reservation_billing`), and what the node's
downtime takes off the bill (`reservation_downtime`). What a reservation in force means for
placement is `work.reservation_holds`. Owns `reservations`."""

__all__: list[str] = []
