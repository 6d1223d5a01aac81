"""The options of `fae probe` (:class:`ProbeConfig`), light to import: the command's parser reads them
before anything loads torch; the run is :func:`fae.probes.runner.run`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from real_fae_core.command import CommandConfig
from fae.probes.options import HFLoadFields


@dataclass
class ProbeFields:
    """`fae probe`'s own options (the hf backend's loading options follow in :class:`ProbeConfig`)."""

    run_dir: str
    model: str
    output: str
    adapter: str | None = None
    records: str | None = None
    layer: int = -1
    bootstrap: int = dataclasses.field(default=2000, metadata={"min": 0})
    seed: int = 0
    batch_size: int = dataclasses.field(default=8, metadata={"min": 1})
    limit: int | None = dataclasses.field(default=None, metadata={"min": 1})
    states_dtype: str = "float16"
    knowledge_reference: str = "verifier"
    knowledge_max_new_tokens: int | None = dataclasses.field(default=None, metadata={"min": 1})


@dataclass
class ProbeConfig(HFLoadFields, ProbeFields, CommandConfig):
    """`fae probe`: DirK over a finished FAE run."""


STATES_DTYPES = ("float16", "float32")
KNOWLEDGE_REFERENCES = ("verifier", "base")
