"""Sessions that keep a model in VRAM (SPEC §1.7): placing one on a node, relaying
forwards through the replica holding the node's channel, closing when idle
(`sessions`), and which GPUs a session holds (`gpus`). What they cost is
`money.session_billing`. Owns `gpu_sessions`."""

__all__: list[str] = []
