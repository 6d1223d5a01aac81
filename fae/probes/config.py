"""The options of `fae probe` (:class:`ProbeConfig`), light to import: the command's parser reads them
before anything loads torch; the run is :func:`fae.probes.runner.run`."""

from __future__ import annotations

from dataclasses import dataclass

from real_fae_core.command import CommandConfig, option
from fae.intervals import MAX_DRAWS
from fae.backends.options import HFLoadFields

STATES_DTYPES = ("float16", "float32")
KNOWLEDGE_REFERENCES = ("verifier", "base")


@dataclass
class ProbeFields:
    """`fae probe`'s own options (the hf backend's loading options follow in :class:`ProbeConfig`)."""

    run_dir: str = option(positional=True, metavar="RUN_DIR", deprecated=("--run",),
                          help="FAE run directory (claims.jsonl, config.json)")
    model: str = option(help="base model directory (HF format)")
    output: str = option(help="directory for dirk.json, dirk_claims.jsonl, states")
    adapter: str | None = option(None, help="optional PEFT/LoRA adapter directory")
    records: str | None = option(None, help="records JSONL (default: the path in the run's config.json)")
    layer: int = option(-1, help="index into hidden_states: -1 = last layer after the final norm (SPEC §7), "
                                 "0 = embeddings, i = output of layer i (default -1)")
    bootstrap: int = option(2000, min=0, max=MAX_DRAWS, help=f"bootstrap resamples, 0 to {MAX_DRAWS} (default 2000)")
    seed: int = option(0, min=0, help="bootstrap seed (default 0)")
    batch_size: int = option(8, min=1, help="prompts per forward pass (default 8)")
    limit: int | None = option(None, min=1, help="probe only the first N claims")
    states_dtype: str = option("float16", choices=STATES_DTYPES, help="dtype of states.safetensors (default float16)")
    knowledge_reference: str = option(
        "verifier", choices=KNOWLEDGE_REFERENCES,
        help="whose state on the claim-only prompt is h(K): the probed verifier (default, SPEC §7) or the base "
             "model without --adapter (the direction toward parametric knowledge; without --adapter the verifier "
             "is the base, the same h(K))")
    knowledge_max_new_tokens: int | None = option(None, min=1, help="tokens of the greedy answer to each claim-only "
                                                  "prompt (default: the run's max_new_tokens, else 64)")


@dataclass
class ProbeConfig(HFLoadFields, ProbeFields, CommandConfig):
    """`fae probe`: DirK over a finished FAE run."""

