"""`fae study --pools DIR --model M --output DIR`: the command line of the evaluation-choice study (SPEC §10).

The parser and its flags live here; what the study asks and writes is :mod:`fae.study.study_runner`.
"""

from __future__ import annotations

import argparse

from real_fae_core.config import add_option_flags
from fae.backends.hf import HFOptions
from fae.backends.openai_backend import OpenAIOptions
from fae.backends.vllm_backend import VLLMOptions
from fae.study.grid import CONTROL_CLAIMS
from fae.study.interfaces import FORMATS
from fae.study.replicates import PAPER_SEEDS
from fae.study.study_runner import BACKENDS, StudyConfig
from fae.study.study_runner import run  # noqa: F401 - the command's run(config), for the dispatcher

CONFIG = StudyConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pools", required=True, help="an output directory of `real-data retrieve` (records.jsonl, "
                   "misses.jsonl): one dataset, packed with --budgets, ideally with --reranker")
    p.add_argument("--output", required=True, help="the study directory (resumed if present)")
    p.add_argument("--model", required=True, help="model path (hf, vllm) or served model name (openai)")
    p.add_argument("--backend", default="hf", choices=BACKENDS)
    p.add_argument("--adapter", help="PEFT LoRA adapter directory (hf, vllm)")
    p.add_argument("--formats", nargs="+", default=list(FORMATS), help="answer formats (default: codes labels)")
    p.add_argument("--budgets", nargs="+", type=int, help="packed budgets to ask (default: every one of the pools)")
    p.add_argument("--seeds", nargs="+", type=int, default=list(PAPER_SEEDS),
                   help="sampled replicates' seeds (default the paper's five); replicate 0 is greedy")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--control-claims", type=int, default=CONTROL_CLAIMS,
                   help=f"hash-selected claims of the greedy controls (default {CONTROL_CLAIMS}; 0: none)")
    p.add_argument("--tokenizer", action="append", default=None,
                   help="a tokenizer the budgets are counted in, for the gold control (repeat per model of the "
                        "study; default with --backend hf: the model's)")
    p.add_argument("--limit", type=int, help="only the first N claims (every unit of each)")
    p.add_argument("--sample", type=int, metavar="N", help="a subset of at least N claims, whole families in "
                   "the order of a hash of the family (families from --families; else each claim is one)")
    p.add_argument("--families", help="`real-data families` file of the pools, for --sample")
    p.add_argument("--chunk-size", type=int, default=64, help="prompts per backend call and per write")
    p.add_argument("--shard", metavar="I/N", help="answer shard I of N (0-based) into OUTPUT/shards/I-of-N")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    g = p.add_argument_group("hf backend")
    g.add_argument("--batch-size", type=int, default=HFOptions.batch_size)
    add_option_flags(g, HFOptions, ("device", "dtype", "trust_remote_code"))
    add_option_flags(p.add_argument_group("vllm backend"), VLLMOptions,
                     ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len"))
    add_option_flags(p.add_argument_group("openai backend"), OpenAIOptions,
                     ("base_url", "api_key_env", "concurrency", "request_timeout", "max_retries", "backoff_base"))
