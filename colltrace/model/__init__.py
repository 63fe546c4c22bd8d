"""The data passed between colltrace's parts: the snapshot (what every rank is doing) the
analyzer reads, as plain JSON-ready dicts."""
