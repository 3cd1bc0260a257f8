"""The marketplace (SPEC §3.4, §4.2): the offers tenants search (`offers`) and the price
recommendations providers get from what comparable GPUs charge and sell
(`price_recommendations`). Read-only."""

__all__: list[str] = []
