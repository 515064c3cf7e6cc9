"""Candidate retrieval: which pairs of a hub are worth a φ_MATCH test, found in about N log N instead of N²."""
