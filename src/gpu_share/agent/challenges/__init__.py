"""Hardware challenges from the node's side (docs/trust.md, "Hardware challenges").

`answering` hears a challenge in the heartbeat answer, waits until the worker can free
the hardware, and talks to the coordinator; the chain itself runs in a child process
(`child`): as ONNX graphs on the device through `benchmarks.engine` (`graphs`,
`device_chain`), in NumPy where onnxruntime is missing. The arithmetic is shared with
the coordinator, which checks it (`gpu_share.challenge`).
"""
