"""The project's core, shared by data_prep, real and fae (docs/architecture.md).

``errors`` (UserError, RunFailure, exit codes), ``cli`` (subcommand dispatch and
the one top-level error handler), ``jsonl`` (located JSON-lines reading),
``atomicio`` (atomic writes), ``hashing`` (sha256 of files and values),
``labels`` (the label set), ``runlock`` (one writer per output), ``fingerprint`` (a run's resume
fingerprint and the compatibility defaults of older runs), ``secrets``
(API keys from the environment, scrubbed from messages), ``yamlio`` (strict
YAML), ``openai_client`` (the one policy for OpenAI-compatible servers).
Nothing here imports the rest of the project.
"""
