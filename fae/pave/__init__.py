"""`fae pave`: prior-state diagnostics (SPEC §9): cli, prompts, sampling, io, metrics, analysis, report."""
