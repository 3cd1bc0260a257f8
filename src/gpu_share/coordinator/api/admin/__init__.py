"""The admin's API (Bearer gpu_admin_…): tenants and keys, provider applications, balances,
payout batches."""
