"""`gpu-share`: a thin command line over the SDK, plus `server`, `agent` and `up`."""
