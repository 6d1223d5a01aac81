#!/usr/bin/env bash
# Models that answer: format tuning for the evaluation-choice study (docs/study.md, "Models that answer:
# format tuning"). For every model in MODELS: Check-COVID train + SciFact train -> records -> pairs in
# both study interfaces (`real-data pairs --interface study`: the study's own prompt, the exact answer
# string as target) -> a LoRA adapter (recipes/study/format_tuning.yaml, 100 steps) -> a merged
# model directory, WORK/models/<model>-format. Then the held-out measure: the study itself
# (recipes/study/reproduce.sh for the untuned models, the same `fae study` grid for the tuned ones) over
# SciFact dev and Check-COVID test, one report with the tuned models beside the untuned ones, one with the
# tuned models alone (their decision label), and the INVALID share per model x format
# (recipes/study/invalid_share.py; the goal: at most MAX_INVALID %).
#
#   DATA=../shared/data MODELS="models/smollm2-135m-instruct models/gemma3-270m" \
#   RERANKER=/path/to/all-MiniLM-L6-v2 RERANKER_KIND=bi-encoder \
#   SCIFACT_SAMPLE=20 COVID_SAMPLE=10 CONTROL_CLAIMS=2 bash recipes/study/format_tune.sh [--dry-run]
#
# Every step is skipped when its output is complete (convert and pairs write atomically, real-train's
# adapter and results appear at its end, real-merge writes its directory when done; `fae study` resumes
# from its responses), so a rerun after a kill redoes only what is missing. --dry-run prints the commands
# and runs nothing. Settings (environment variables, defaults in brackets):
#   DATA            the data directory: check-covid/{covidCheck_train_composed+extracted.json,corpus.json},
#                   scifact/{claims_train.jsonl,corpus_cited.jsonl}, and what recipes/study/reproduce.sh reads
#   MODELS          the untuned model directories (hf), space-separated
#   WORK            where records, pairs, adapters, models, studies and reports go [study-work], shared with
#                   recipes/study/reproduce.sh (its pools, families and untuned studies are reused)
#   VARIANT         the pairs variant [no_enhancement: gold evidence and NOT_ENOUGH_INFO negatives; `sft`
#                   has no NOT_ENOUGH_INFO target, so a model tuned on it would never answer C]
#   RECIPE          the training recipe [recipes/study/format_tuning.yaml]
#   MAX_POOL_TOKENS pools trimmed to this many tokens of each model, gold kept [256, the study's smaller budget]
#   MAX_LENGTH      pairs longer than this many tokens are dropped [1024, the recipe's max_length]
#   MEASURE         1: the held-out study and report after the training; 0: stop at the tuned models [1]
#   MAX_INVALID     the INVALID share (%) per format a tuned model must not exceed [5]
#   PAIRS_ARGS TRAIN_ARGS MERGE_ARGS   extra arguments of real-data pairs, real-train, real-merge
#   RERANKER RERANKER_KIND SCIFACT_SAMPLE COVID_SAMPLE CONTROL_CLAIMS STUDY_ARGS   as recipes/study/reproduce.sh
#                   (passed to it; the tuned models' studies use the same grid and sample)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# recipe and script paths print relative when run from the checkout itself
[[ $PWD == "$(cd "$HERE/../.." && pwd)" ]] && HERE=recipes/study
DRY_RUN=0
case ${1:-} in
    --dry-run) DRY_RUN=1 ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    "") ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

: "${DATA:?set DATA to the data directory}"
: "${MODELS:?set MODELS to one or more model directories}"
: "${WORK:=study-work}"
: "${VARIANT:=no_enhancement}"
: "${RECIPE:=$HERE/format_tuning.yaml}"
: "${MAX_POOL_TOKENS:=256}"
: "${MAX_LENGTH:=1024}"
: "${MEASURE:=1}"
: "${MAX_INVALID:=5}"
: "${PAIRS_ARGS:=}" "${TRAIN_ARGS:=}" "${MERGE_ARGS:=}"
: "${SCIFACT_SAMPLE:=}"
: "${COVID_SAMPLE:=}"
: "${CONTROL_CLAIMS:=16}"
: "${STUDY_ARGS:=}"
: "${PYTHON:=python3}"
export DATA MODELS WORK SCIFACT_SAMPLE COVID_SAMPLE CONTROL_CLAIMS STUDY_ARGS

COVID_TRAIN="$DATA/check-covid/covidCheck_train_composed+extracted.json"
COVID_CORPUS="$DATA/check-covid/corpus.json"
SCIFACT_TRAIN="$DATA/scifact/claims_train.jsonl"
SCIFACT_CORPUS="$DATA/scifact/corpus_cited.jsonl"

# every prerequisite before the first step: commands, data files, model directories, the recipe
missing=()
for c in real-data real-train real-merge fae; do
    command -v "$c" >/dev/null || missing+=("command $c (pip install -e .)")
done
for f in "$COVID_TRAIN" "$COVID_CORPUS" "$SCIFACT_TRAIN" "$SCIFACT_CORPUS"; do
    [[ -f $f ]] || missing+=("data file $f")
done
for m in $MODELS; do [[ -d $m ]] || missing+=("model directory $m"); done
[[ -f $RECIPE ]] || missing+=("recipe $RECIPE")
if (( ${#missing[@]} )); then
    printf 'recipes/study/format_tune.sh: missing %s\n' "${missing[@]}" >&2
    if [[ $DRY_RUN == 1 ]]; then
        echo "# prerequisites: ${#missing[@]} missing (listed on stderr); a real run would stop here"
    else
        exit 2
    fi
fi

# step DONE_FILE... -- CMD...: print CMD and run it, unless every DONE_FILE exists; no DONE_FILE: always run
# (a command that resumes by itself)
step() {
    local done_files=() f missing=0
    while [[ $1 != -- ]]; do done_files+=("$1"); shift; done
    shift
    for f in "${done_files[@]}"; do [[ -e $f ]] || missing=1; done
    if (( ${#done_files[@]} )) && [[ $missing == 0 ]]; then
        echo "# done: ${done_files[*]}"
        return 0
    fi
    printf '+'
    printf ' %q' "$@"
    printf '\n'
    [[ $DRY_RUN == 1 ]] || "$@"
}

# concat OUTPUT INPUT...: the records files one after the other, OUTPUT only when complete
concat() {
    local out=$1
    shift
    mkdir -p "$(dirname "$out")"
    cat "$@" > "$out.partial"
    mv "$out.partial" "$out"
}

started=$(date +%s)
base_tokenizers=() tuned=()
for m in $MODELS; do base_tokenizers+=(--tokenizer "$m"); done

for m in $MODELS; do
    name=$(basename "$m")
    data="$WORK/format-tuning/data/$name"
    pairs="$WORK/format-tuning/pairs/$name/$VARIANT-study"
    adapter="$WORK/format-tuning/adapters/$name/$VARIANT-study"
    model="$WORK/models/$name-format"
    echo "# $name: training claims -> records (pools of at most $MAX_POOL_TOKENS of its tokens)"
    step "$data/check-covid-train.jsonl" -- real-data convert --dataset check-covid --claims "$COVID_TRAIN" \
        --corpus "$COVID_CORPUS" --output "$data/check-covid-train.jsonl" --max-pool-tokens "$MAX_POOL_TOKENS" \
        --tokenizer "$m"
    step "$data/scifact-train.jsonl" -- real-data convert --dataset scifact --claims "$SCIFACT_TRAIN" \
        --corpus "$SCIFACT_CORPUS" --output "$data/scifact-train.jsonl" --max-pool-tokens "$MAX_POOL_TOKENS" \
        --tokenizer "$m"
    step "$data/train.jsonl" -- concat "$data/train.jsonl" "$data/check-covid-train.jsonl" "$data/scifact-train.jsonl"
    echo "# $name: pairs in both study interfaces, a LoRA adapter, the merged model"
    # shellcheck disable=SC2086  # the *_ARGS are word-split on purpose
    step "$pairs/stats.json" -- real-data pairs --records "$data/train.jsonl" --variant "$VARIANT" --interface study \
        --tokenizer "$m" --max-length "$MAX_LENGTH" --output "$pairs" --overwrite $PAIRS_ARGS
    # shellcheck disable=SC2086
    step "$adapter/adapter_model.safetensors" "$adapter/train_results.json" -- real-train --config "$RECIPE" \
        --model_name_or_path "$m" --dataset_name "$pairs" --variant "$VARIANT" --output_dir "$adapter" $TRAIN_ARGS
    # shellcheck disable=SC2086
    step "$model/config.json" -- real-merge --adapter "$adapter" --base "$m" --output "$model" $MERGE_ARGS
    tuned+=("$model")
done

if [[ $MEASURE == 0 ]]; then
    echo "# MEASURE=0: tuned models in ${tuned[*]}; the held-out study is not run"
    exit 0
fi

echo "# held-out: the untuned models' study (recipes/study/reproduce.sh: pools, families, studies, report)"
step -- bash "$HERE/reproduce.sh"
echo "# held-out: the tuned models on the untuned study's units and grid (the untuned models' tokenizers count the budgets)"
studies=()
for m in $MODELS; do
    for name in scifact-dev check-covid-test; do studies+=("$WORK/studies/$name-$(basename "$m")"); done
done
first=${MODELS%% *}
tuned_studies=()
for m in "${tuned[@]}"; do
    for name in scifact-dev check-covid-test; do
        out="$WORK/studies/$name-$(basename "$m")"
        # exactly the units the first untuned model's study asked (its sample record carried over), whichever
        # families file sampled them
        # shellcheck disable=SC2086  # STUDY_ARGS is word-split on purpose
        step -- fae study --pools "$WORK/pools/$name" --output "$out" --model "$m" --backend hf \
            "${base_tokenizers[@]}" --control-claims "$CONTROL_CLAIMS" --chunk-size 192 --no-progress \
            --units-from "$WORK/studies/$name-$(basename "$first")" $STUDY_ARGS
        studies+=("$out")
        tuned_studies+=("$out")
    done
done
report="$WORK/report-format-tuning"
step -- fae study-report "${studies[@]}" --families "$WORK/families/scifact-dev.jsonl" \
    --families "$WORK/families/check-covid-test.jsonl" --output "$report"
echo "# the tuned models alone: their own decision label (the untuned models' unanswered formats withhold any label"
echo "# of a report they are in) and intervals adjusted over their own contrasts"
step -- fae study-report "${tuned_studies[@]}" --families "$WORK/families/scifact-dev.jsonl" \
    --families "$WORK/families/check-covid-test.jsonl" --output "$WORK/report-tuned"
names=()
for m in "${tuned[@]}"; do names+=("$(basename "$m")"); done
echo "# the INVALID share per model x format (every primary answer); the tuned models must stay at most $MAX_INVALID%"
step -- "$PYTHON" "$HERE/invalid_share.py" "$report/study_report.json" --max "$MAX_INVALID" --models "${names[@]}"
if [[ $DRY_RUN == 1 ]]; then
    echo "# dry run: nothing was executed"
else
    echo "# done in $(( $(date +%s) - started )) s: $report/study_report.md"
fi
