"""The foundation every coordinator layer uses, and which uses no layer: settings,
the database and its tables, the clock, ids, keys, signing and the error family."""
