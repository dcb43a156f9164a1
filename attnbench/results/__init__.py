"""Results: the store, provenance of records, statistics, and the papers' reported numbers."""
