"""Hidden-state probes (SPEC §7): `fae probe` (DirK), `fae probe-report` and `fae neurons`."""
