"""The ablation run (SPEC §6): `fae run`, its engine, run directory I/O, metrics and reports."""
