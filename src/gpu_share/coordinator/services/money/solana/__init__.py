"""USDC on Solana: the JSON-RPC client (`rpc`), the payout keypair (`keys`) and the
SPL-token transfers the platform signs (`transfers`). Nothing here touches the
database; `chain_payouts` (one level up) is the state machine that uses them."""
