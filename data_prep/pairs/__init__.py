"""REAL training pairs (SPEC §4): building them (``build``) and `real-data pairs` (``runner``: its config and run)."""
