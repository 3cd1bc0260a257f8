"""Background work started by the app's lifespan: each job is `run_once(replica)`."""
