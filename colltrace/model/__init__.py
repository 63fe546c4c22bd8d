"""The data passed between colltrace's parts: the snapshot (what every rank is doing) the
analyzer reads, as plain JSON-ready dicts, and the typed findings it returns (finding.py)."""
