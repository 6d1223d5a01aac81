"""Comparing verifiers: `fae compare` (score accounting, SPEC §8) and `fae pave` (prior-state diagnostics, SPEC §9)."""
