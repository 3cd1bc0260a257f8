"""The node benchmarks itself (SPEC §3.3; docs/benchmarks.md).

`compute` and `memory` measure each GPU (onnxruntime's CUDA provider, else PyTorch,
else CuPy) and the CPU (onnxruntime's CPU provider, else numpy); `engine` runs ONNX
graphs on a device with their tensors kept there (`ort_device` measures through it, and
hardware challenges use it too); `storage` the data folder's disk; `network` the way to
the coordinator. `local` runs the GPU, CPU and disk measurements in a child process, so
a GPU's memory and a crash stay out of the agent; `suite` runs it all into a
`BenchmarkReport`; `schedule` decides when, and keeps a run off the machine while it has
work. They reach the coordinator only through the `uplink.Uplink` the agent hands them,
and import nothing else of the agent.
"""
