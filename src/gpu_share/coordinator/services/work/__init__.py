"""Invokes from submit to result (SPEC §1.5, §4.1, §4.3): the tenant's side (`invokes`,
`quotes`, `probing`), the one owner of an invoke's status (`invoke_state`), the claim that
places queued work on a node (`claims`, reading the node's load in `node_load`, the
queue in fair-share order in `fair_share`, better nodes waiting in `rivals`, spot checks
for trusted nodes in `check_offers`) and leases each job it takes (`leased_jobs`, its
files as `artifact_refs`), a node's lease long-poll around it (`lease_polls`), the
lease's life (`leases`) and the files it produces
(`job_files`, each checkpoint checked by `checkpoint_formats`), which GPUs and how much
memory work may take (`gpu_assignment`, `memory_fit`, `reservation_holds`: what the
reservations in force leave to it), and spot work giving way (`preemption`, over
`preemption_rooms`). Owns `invokes`, `invoke_logs`."""

__all__ = [
    "artifact_refs",
    "claims",
    "gpu_assignment",
    "invoke_state",
    "invokes",
    "memory_fit",
    "reservation_holds",
]
