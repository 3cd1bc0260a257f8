"""What anyone may call without a key: health, applying as a tenant or a provider (and
following the application), and the agent's install script."""
