"""Comparing verifiers: `fae compare` (score accounting, SPEC §8); PAVE is fae.pave (SPEC §9)."""
