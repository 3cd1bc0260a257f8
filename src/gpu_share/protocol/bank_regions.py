"""Where bank payouts can go (SPEC §3.6, §4.5): the countries of the SEPA scheme, by the
two-letter code that starts their IBANs. A bank payout is a SEPA credit transfer, so an
account outside these countries cannot be paid by the platform's bank file.

The list follows the European Payments Council's register of SEPA countries and
territories that have IBANs of their own (the EEA, Switzerland, the United Kingdom,
Monaco, San Marino, Andorra, the Vatican City, Albania, Montenegro, Moldova and North
Macedonia, with the territories that use their own country code).
"""

SEPA = "SEPA"

SEPA_COUNTRIES = frozenset(
    {
        # the European Union
        "AT", "BE", "BG", "CY", "CZ", "DE", "DK", "EE", "ES", "FI", "FR", "GR", "HR", "HU",
        "IE", "IT", "LT", "LU", "LV", "MT", "NL", "PL", "PT", "RO", "SE", "SI", "SK",
        # the rest of the EEA
        "IS", "LI", "NO",
        # members of the scheme outside the EEA
        "AD", "AL", "CH", "GB", "MC", "MD", "ME", "MK", "SM", "VA",
        # territories with IBANs of their own
        "GI", "GG", "IM", "JE", "PM", "BL", "MF", "GF", "GP", "MQ", "RE", "YT", "AX",
    }
)  # fmt: skip


def region_countries(regions: list[str]) -> frozenset[str]:
    """The countries `regions` enables: SEPA is all of them, a country code just itself.
    ValueError names an entry that is neither (a bank file can pay only SEPA countries)."""
    countries: set[str] = set()
    for region in regions:
        name = region.strip().upper()
        if name == SEPA:
            countries |= SEPA_COUNTRIES
        elif name in SEPA_COUNTRIES:
            countries.add(name)
        else:
            raise ValueError(
                f"{region!r} is not a bank payout region: use SEPA or the two-letter code "
                "of a country in SEPA"
            )
    return frozenset(countries)


def describe(regions: list[str]) -> str:
    """How a page or an error names the enabled regions: "SEPA", "DE, FR" or "none"."""
    names = [r.strip().upper() for r in regions if r.strip()]
    return ", ".join(names) if names else "none"


def iban_outside(iban: str, regions: list[str]) -> str | None:
    """Why a bank account with this (valid, compact) IBAN cannot be paid under `regions`,
    or None when it can."""
    if not regions:
        return "bank payouts are turned off on this platform: choose USDC on Solana"
    country = iban[:2].upper()
    if country in region_countries(regions):
        return None
    return (
        f"this IBAN is in {country}, and bank payouts go only to accounts in "
        f"{describe(regions)}: use an account there, or USDC on Solana"
    )
