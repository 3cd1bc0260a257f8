"""The agent: runs on a provider's machine, registers it, leases jobs and runs them isolated.

It imports nothing from the coordinator; it speaks `gpu_share.protocol` over HTTP.
"""
