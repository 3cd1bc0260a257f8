"""The node benchmarks itself (SPEC §3.3; docs/benchmarks.md).

`compute` and `memory` measure each GPU (PyTorch, else CuPy) and the CPU (numpy);
`storage` the data folder's disk; `network` the way to the coordinator. `local` runs
the first three in a child process, so a GPU's memory and a crash stay out of the
agent; `suite` runs it all into a `BenchmarkReport`; `schedule` decides when, and keeps
a run off the machine while it has work. They reach the coordinator only through the
`uplink.Uplink` the agent hands them, and import nothing else of the agent.
"""
