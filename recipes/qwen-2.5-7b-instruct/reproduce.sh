#!/usr/bin/env bash
# Reproduce the paper's experiment with Qwen-2.5-7B-Instruct, from the official
# releases to the reports: convert -> enhance -> pairs -> train -> FAE -> probes -> reports.
# Paper Table 3: the base model and REAL (VARIANTS="sft no_ablation no_enhancement real" adds the ablations).
# Each step is skipped when its output is complete, so rerunning resumes.
#
#   recipes/qwen-2.5-7b-instruct/reproduce.sh             # run; outputs go under the current directory
#   recipes/qwen-2.5-7b-instruct/reproduce.sh --dry-run   # print the commands, run nothing
#
# Every setting is an environment variable with the paper's value as default
# (MODEL, VARIANTS, TEST_SETS, data files, ANNOTATORS, ACCELERATE_CONFIG,
# NUM_PROCESSES, TRAIN_ARGS, output roots ...): see recipes/README.md.
MODEL_ID=qwen-2.5-7b-instruct
: "${MODEL:=Qwen/Qwen2.5-7B-Instruct}"
: "${VARIANTS:=real}"
source "$(dirname "${BASH_SOURCE[0]}")/../reproduce_lib.sh"
reproduce_main "$@"
