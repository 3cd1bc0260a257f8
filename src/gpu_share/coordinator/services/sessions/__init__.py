"""Sessions that keep a model in VRAM (SPEC §1.7): placing one on a node, relaying
forwards through the replica holding the node's channel (`sessions`), how one ends
(`closing`), the upkeep of those a process holds, idle ones closed among them
(`upkeep`), and which GPUs a session holds (`gpus`). What they cost is
`money.session_billing`. Owns `gpu_sessions`."""

__all__: list[str] = []
