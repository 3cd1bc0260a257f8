"""The rules. Each function takes an explicit database session and the time; no HTTP here."""
