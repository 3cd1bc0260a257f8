"""The rules, free of HTTP, one package per domain. Each function takes an explicit
database session and the time.

A domain owns the writes to its tables and uses another domain only through the modules
that domain's `__init__` lists in `__all__`; the arrows run one way, lowest first
(docs/architecture.md draws them; tests/test_architecture.py holds them):

    accounts  mail  artifacts  webhooks  (use no other domain)
    nodes      → accounts
    providers  → nodes, accounts, mail
    money      → providers, nodes, mail, webhooks
    work       → money, nodes, artifacts, webhooks
    rentals    → work, money, nodes, webhooks
    sessions   → work, money, nodes, webhooks
    market     → work, nodes
    platform   → nodes
    trust      → nodes
"""
