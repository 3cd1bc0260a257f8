"""The rules, free of HTTP, one package per domain. Each function takes an explicit
database session and the time.

A domain owns the writes to its tables and uses another domain only through the modules
that domain's `__init__` lists in `__all__`; the arrows run one way, lowest first
(docs/architecture.md draws them; tests/test_architecture.py holds them):

    accounts  mail  artifacts            (use no other domain)
    nodes      → accounts
    providers  → nodes, accounts, mail
    money      → providers, nodes, mail
    work       → money, nodes, artifacts
    rentals    → work, money, nodes
    sessions   → work, money, nodes
    market     → work, nodes
    platform   → nodes
    trust      → nodes
"""
