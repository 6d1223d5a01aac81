#!/usr/bin/env bash
# Reproduce the paper's experiment with Llama-3.1-8B-Instruct, from the official
# releases to the reports: convert -> enhance -> pairs -> train -> FAE -> probes -> reports.
# Paper Tables 1-2 and Figures 4-6: the four variants (SPEC §4) and the base model.
# Each step is skipped when its output is complete, so rerunning resumes.
#
#   recipes/llama-3.1-8b-instruct/reproduce.sh             # run; outputs go under the current directory
#   recipes/llama-3.1-8b-instruct/reproduce.sh --dry-run   # print the commands, run nothing
#
# Every setting is an environment variable with the paper's value as default
# (MODEL, VARIANTS, TEST_SETS, data files, ANNOTATORS, ACCELERATE_CONFIG,
# NUM_PROCESSES, TRAIN_ARGS, output roots ...): see recipes/README.md.
MODEL_ID=llama-3.1-8b-instruct
: "${MODEL:=meta-llama/Llama-3.1-8B-Instruct}"
: "${VARIANTS:=sft no_ablation no_enhancement real}"
source "$(dirname "${BASH_SOURCE[0]}")/../reproduce_lib.sh"
reproduce_main "$@"
