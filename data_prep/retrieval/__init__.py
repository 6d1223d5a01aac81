"""Retrieval (SPEC §10): evidence pools from a corpus, their two orderings, budget packing, claim families."""
