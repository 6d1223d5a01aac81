"""`fae pave --records FILE --model M --output DIR`: the command line of PAVE (SPEC §9).

The parser and its flags live here; what PAVE samples, computes and writes is :mod:`fae.pave.runner`.
"""

from __future__ import annotations

import argparse

from real_fae_core.config import add_option_flags
from real_fae_core.flags import deprecated_alias
from data_prep.prompts import LINE_IDS
from fae.backends import ANSWER_MAX_NEW_TOKENS, BackendOptions
from fae.backends.hf import HFOptions
from fae.backends.openai_backend import OpenAIOptions
from fae.backends.vllm_backend import VLLMOptions
from fae.pave.runner import BACKENDS, HF_FIELDS, OPENAI_FIELDS, STABILITY, VLLM_FIELDS, PaveConfig
from fae.pave.runner import run  # noqa: F401 - the command's run(config), for the dispatcher

CONFIG = PaveConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", required=True, help="claim records (.jsonl); optional field "
                   "counterfactual_sentences: [{\"id\", \"text\"}, ...] = misleading evidence, or one such "
                   "list per kind {\"entity\": [...], \"semantic\": [...]} (real-data counterfactual)")
    p.add_argument("--output", required=True, help="output directory (resumed if present)")
    p.add_argument("--backend", default="hf", choices=BACKENDS,
                   help="hf (default), openai or vllm (N answers per prompt as one request with n = N)")
    p.add_argument("--model", required=True, help="model path (hf) or served model name (openai)")
    p.add_argument("--adapter", help="PEFT LoRA adapter directory (hf)")
    p.add_argument("--samples", type=int, default=10,
                   help="sampled answers per prompt for states, CR and PR, N (default 10, the paper's)")
    p.add_argument("--temperature", type=float, default=0.3,
                   help="their sampling temperature, > 0 (default 0.3, the paper's)")
    p.add_argument("--jsd-samples", type=int, default=5,
                   help="sampled answers per prompt for the JSD rule, K (default 5, the paper's)")
    p.add_argument("--jsd-temperature", type=float, default=1.0,
                   help="their sampling temperature, > 0 (default 1.0, the paper's); with the same K and "
                        "temperature as the profile the rule reuses the profile's answers")
    p.add_argument("--max-new-tokens", type=int, default=ANSWER_MAX_NEW_TOKENS)
    p.add_argument("--stability", choices=STABILITY, default="auto",
                   help="JSD over per-run label probabilities, or the paper's vote-based variant (binary "
                        "entropy of the SUPPORT share); auto = JSD when every run has its own distribution, "
                        "vote when some are missing or all runs of every prompt share one")
    p.add_argument("--tune-split", type=float, default=0.3, metavar="FRACTION",
                   help="share of claims held out to tune τ (hash of id and --seed); the rest is the "
                        "test split for CE/IE/OA (default 0.3)")
    p.add_argument("--keep-refusals", action="store_true",
                   help="turn the paper's refusal filtering off: keep claims whose claim-only majority is "
                        "NOT_ENOUGH_INFO or invalid (they count as wrong priors)")
    p.add_argument("--definite-prior-only", action="store_true",
                   help="refusal filtering, now the default (kept so older commands run)")
    p.add_argument("--check-run", metavar="RUN_DIR",
                   help="a finished `fae run` of the same verifier on these records: report PAVE's "
                        "gold-evidence accuracy beside its round-0 accuracy and flag a gap > 10 points")
    deprecated_alias(p, "--fae-run", "--check-run")
    p.add_argument("--seed", type=int, default=0,
                   help="sampling and split seed; each prompt's answers are seeded by (seed, claim id, condition)")
    p.add_argument("--limit", type=int, help="only the first N SUPPORT/REFUTE records")
    p.add_argument("--chunk-size", type=int, default=32,
                   help="claims per write to samples.jsonl (answers do not depend on it)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--line-ids", default="original", choices=LINE_IDS,
                   help="line numbers shown (SPEC §3): original record ids (default, the paper's protocol; a gold-only "
                        "pool then shows holes) or renumbered 0..n-1 in reading order, cited numbers mapped back")
    # The backends' own options, declared from their dataclasses (as `fae run` has them); PAVE's --seed
    # seeds each prompt's samples itself, and it reads no label probabilities from the FAE backends.
    add_option_flags(p, BackendOptions, ["constrained_decoding"])
    g = p.add_argument_group("hf backend")
    g.add_argument("--batch-size", type=int, default=8,
                   help="PAVE samples one prompt at a time (each prompt's N answers are one generate call "
                        "seeded by the prompt's own key, so they never depend on other prompts): a value other "
                        "than the default 8 is refused")
    add_option_flags(g, HFOptions, HF_FIELDS)
    g.add_argument("--prefill-once", action="store_true",
                   help="run a prompt's prefill once for its N samples and copy the KV cache (about 1/N of the "
                        "prompt's work); its samples equal the default's only on CPUs and GPUs where a row of a "
                        "batched matmul equals that row alone (an AVX-512 CPU: yes; an AMX CPU: no), and one "
                        "AMX CPU once gave other samples from one process to the next (a resumed run may then "
                        "differ from an uninterrupted one: benchmarks/pave_reproducibility.py checks a machine); "
                        "it is off unless asked, and a run made with it never resumes one made without it")
    add_option_flags(p.add_argument_group("vllm backend (and --dtype)"), VLLMOptions, VLLM_FIELDS)
    add_option_flags(p.add_argument_group("openai backend"), OpenAIOptions, OPENAI_FIELDS)
