"""Invokes from submit to result (SPEC §1.5, §4.1, §4.3): the tenant's side (`invokes`,
`quotes`, `probing`), the one owner of an invoke's status (`invoke_state`), the claim that
places queued work on a node (`claims`, reading the node's load in `node_load`), the
lease's life (`leases`) and the files it produces (`job_files`, each checkpoint checked
by `checkpoint_formats`), which GPUs and how much memory work may take (`gpu_assignment`,
`memory_fit`, `reservation_holds`: what the reservations in force leave to it), and spot
work giving way (`preemption`, over `preemption_rooms`). Owns `invokes`, `invoke_logs`."""

__all__ = [
    "claims",
    "gpu_assignment",
    "invoke_state",
    "invokes",
    "memory_fit",
    "reservation_holds",
]
