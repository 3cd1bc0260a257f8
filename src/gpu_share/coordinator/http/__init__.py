"""What the JSON API (`api/`) and the pages (`web/`) both take from a request: the replica
serving it, this server's public URL and the caller's address (`replica`), who a key
belongs to (`principals`), and artifact bytes in and out (`artifacts`). Neither of
those layers imports the other; both import this."""
