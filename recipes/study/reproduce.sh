#!/usr/bin/env bash
# The evaluation-choice study of SPEC §10 on real data (docs/study.md, "The real study"): SciFact dev and
# Check-COVID test, each over its corpus, both orderings, budgets 256 and 2048, both answer formats,
# greedy + the paper's five seeds, for every model in MODELS; then one report over all of them.
#
#   DATA=../shared/data MODELS="models/smollm2-135m-instruct models/gemma3-270m" \
#   RERANKER=/path/to/all-MiniLM-L6-v2 RERANKER_KIND=bi-encoder bash recipes/study/reproduce.sh
#
# Every step is skipped when its output is complete and resumes when it is not (retrieve writes its
# directory only when done; `fae study` resumes from its responses), so a rerun after a kill redoes
# only what is missing. Settings (environment variables, defaults in brackets):
#   DATA            the data directory: scifact/{claims_dev.jsonl,corpus_cited.jsonl},
#                   check-covid/{corpus.json,covidCheck_test_*.json}
#   MODELS          model directories (hf backend), space-separated; their tokenizers count the budgets
#   RERANKER        the second ordering's model [BAAI/bge-reranker-base, the paper's]
#   RERANKER_KIND   cross-encoder | bi-encoder [cross-encoder]
#   WORK            where pools, studies and the report go [study-work]
#   SCIFACT_SAMPLE, COVID_SAMPLE   claims per dataset, whole families by hash (empty: all) [empty]
#   CONTROL_CLAIMS  claims of the greedy controls per dataset [16]
#   STUDY_ARGS      extra `fae study` arguments (e.g. "--dtype float32")
set -euo pipefail

: "${DATA:?set DATA to the data directory}"
: "${MODELS:?set MODELS to one or more model directories}"
: "${RERANKER:=BAAI/bge-reranker-base}"
: "${RERANKER_KIND:=cross-encoder}"
: "${WORK:=study-work}"
: "${SCIFACT_SAMPLE:=}"
: "${COVID_SAMPLE:=}"
: "${CONTROL_CLAIMS:=16}"
: "${STUDY_ARGS:=}"

# every prerequisite before the first step: commands, data files, model directories
missing=()
for c in real-data fae; do command -v "$c" >/dev/null || missing+=("command $c (pip install -e .)"); done
for f in scifact/claims_dev.jsonl scifact/corpus_cited.jsonl check-covid/corpus.json \
         check-covid/covidCheck_test_composed.json check-covid/covidCheck_test_extracted.json; do
    [[ -f $DATA/$f ]] || missing+=("data file $DATA/$f")
done
for m in $MODELS; do [[ -d $m ]] || missing+=("model directory $m"); done
if [[ $RERANKER == /* || $RERANKER == .* || $RERANKER == ~* ]]; then
    [[ -d $RERANKER ]] || missing+=("reranker directory $RERANKER")
fi
if (( ${#missing[@]} )); then
    printf 'recipes/study/reproduce.sh: missing %s\n' "${missing[@]}" >&2
    exit 2
fi

tokenizers=()
for m in $MODELS; do tokenizers+=(--tokenizer "$m"); done
mkdir -p "$WORK/idx" "$WORK/families" "$WORK/studies"
started=$(date +%s)

step() { echo "[$(date +%H:%M:%S)] $*" >&2; }

retrieve() {  # dataset name corpus format claims...
    local dataset=$1 name=$2 corpus=$3 format=$4
    shift 4
    [[ -f $WORK/idx/$name.sqlite ]] || real-data index --corpus "$corpus" --format "$format" \
        --output "$WORK/idx/$name.sqlite"
    [[ -d $WORK/pools/$name ]] || real-data retrieve --dataset "$dataset" --claims "$@" --corpus "$corpus" \
        --index "$WORK/idx/$name.sqlite" --output "$WORK/pools/$name" --reranker "$RERANKER" \
        --reranker-kind "$RERANKER_KIND" --budgets 256 2048 "${tokenizers[@]}"
    [[ -f $WORK/families/$name.jsonl ]] || real-data families --records "$WORK/pools/$name/records.jsonl" \
        --output "$WORK/families/$name.jsonl"
}

step "retrieval: SciFact dev"
retrieve scifact scifact-dev "$DATA/scifact/corpus_cited.jsonl" scifact "$DATA/scifact/claims_dev.jsonl"
step "retrieval: Check-COVID test"
retrieve check-covid check-covid-test "$DATA/check-covid/corpus.json" check-covid \
    "$DATA/check-covid/covidCheck_test_composed.json" "$DATA/check-covid/covidCheck_test_extracted.json"

studies=()
for m in $MODELS; do
    for name in scifact-dev check-covid-test; do
        sample=$([[ $name == scifact-dev ]] && echo "$SCIFACT_SAMPLE" || echo "$COVID_SAMPLE")
        out="$WORK/studies/$name-$(basename "$m")"
        step "fae study: $name x $(basename "$m")"
        # shellcheck disable=SC2086  # STUDY_ARGS is word-split on purpose
        fae study --pools "$WORK/pools/$name" --output "$out" --model "$m" --backend hf \
            "${tokenizers[@]}" --control-claims "$CONTROL_CLAIMS" --chunk-size 192 --no-progress \
            ${sample:+--sample "$sample" --families "$WORK/families/$name.jsonl"} $STUDY_ARGS
        studies+=("$out")
    done
done

step "fae study-report"
# both families files are read: a list flag given again appends (tests/test_list_flags.py)
fae study-report "${studies[@]}" --families "$WORK/families/scifact-dev.jsonl" \
    --families "$WORK/families/check-covid-test.jsonl" --output "$WORK/report"
step "done in $(( $(date +%s) - started )) s: $WORK/report/study_report.md"
