"""`fae probe RUN_DIR --model M --output DIR`: the command line of the DirK probe (SPEC §7).

The parser and its flags live here; what the probe computes and writes is :mod:`fae.probes.runner`.
"""

from __future__ import annotations

import argparse

from real_fae_core.command import CommandResult
from real_fae_core.config import add_option_flags
from real_fae_core.flags import deprecated_alias
from fae.backends.hf import HFOptions
from fae.probes.config import KNOWLEDGE_REFERENCES, STATES_DTYPES, ProbeConfig

CONFIG = ProbeConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="FAE run directory (claims.jsonl, config.json)")
    deprecated_alias(p, "--run", "RUN_DIR")
    p.add_argument("--model", required=True, help="base model directory (HF format)")
    p.add_argument("--adapter", default=None, help="optional PEFT/LoRA adapter directory")
    p.add_argument("--output", required=True, help="directory for dirk.json, dirk_claims.jsonl, states")
    p.add_argument("--records", default=None,
                   help="records JSONL (default: the path in the run's config.json)")
    p.add_argument("--layer", type=int, default=-1,
                   help="index into hidden_states: -1 = last layer after the final norm "
                        "(SPEC §7), 0 = embeddings, i = output of layer i (default -1)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per forward pass (default 8)")
    add_option_flags(p, HFOptions, ["device", "dtype", "trust_remote_code"])  # as `fae run --backend hf`
    p.add_argument("--limit", type=int, default=None, help="probe only the first N claims")
    p.add_argument("--states-dtype", choices=STATES_DTYPES, default="float16",
                   help="dtype of states.safetensors (default float16)")
    p.add_argument("--knowledge-reference", choices=KNOWLEDGE_REFERENCES, default="verifier",
                   help="whose state on the claim-only prompt is h(K): the probed verifier (default, SPEC §7) "
                        "or the base model without --adapter (the direction toward parametric knowledge; "
                        "without --adapter the verifier is the base, the same h(K))")
    p.add_argument("--knowledge-max-new-tokens", type=int, default=None,
                   help="tokens of the greedy answer to each claim-only prompt (default: the run's "
                        "max_new_tokens, else 64)")


def run(config: ProbeConfig) -> CommandResult:
    from fae.probes.runner import run as run_probe  # it loads torch: `fae --help` does not

    return run_probe(config)
