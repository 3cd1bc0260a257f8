"""The provider's API (Bearer gpu_pk_…, SPEC §3): their account and machines, prices,
schedules and reliability, earnings and payouts."""
