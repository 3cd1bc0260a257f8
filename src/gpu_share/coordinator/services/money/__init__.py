"""The books and what moves through them (SPEC §3.6, §4.4): the double-entry ledger
(`ledger`), what work costs and how it is reserved and settled (`billing`, and for
sessions `session_billing`), a tenant's balance, usage and top-ups (`tenant_billing`), a
provider's earnings (`earnings`), held until they can be trusted (`earnings_hold`) and
taken back from a cheat while held (`clawbacks`), and payouts (`payouts`,
`payout_batches`, `payout_calendar`, `payout_mails`), and the platform's totals for the
admin overview (`books`), and a tenant's own spending cap and low-balance mail
(`spending_limits`, the one path of every RESERVE), and USDC on Solana: payouts the
platform signs and sends (`chain_payouts`, `chain_sending`, over `solana/`: the RPC
client, the payout keypair, the transfers) and tenants' self-serve top-ups
(`deposits`, `deposit_watch`). Owns `ledger_accounts`, `ledger_transactions`,
`ledger_entries`, `earnings_holds`, `payout_batches`, `payouts`, `spending_limits`,
`chain_payouts`, `deposits`, `deposit_arrivals`."""

__all__ = ["billing", "clawbacks", "ledger", "session_billing", "spending_limits"]
