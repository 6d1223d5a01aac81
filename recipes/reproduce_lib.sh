# Shared steps of the paper's experiment, sourced by recipes/<model>/reproduce.sh.
#
# The wrapper sets MODEL_ID (the folder name: paths and recipes) and the
# defaults of MODEL and VARIANTS, then calls `reproduce_main "$@"`.
# Every setting below is an environment variable with the paper's value as its
# default; see recipes/README.md for the list and the path scheme.
#
# Each step runs only when its output is missing or incomplete. The test of
# completeness is the file a step writes last (atomically where the command
# writes atomically), so a rerun after a crash or Ctrl-C redoes only the
# unfinished steps, and the commands that can resume (enhance: its answer
# cache; real.train: its checkpoints; fae run: its claims.jsonl) resume.

# --- settings ---------------------------------------------------------------
_reproduce_settings() {
    REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    # recipe and config paths print relative when run from the checkout itself
    [[ $PWD == "$REPO_ROOT" ]] && REPO_ROOT=.

    # the backbone and what to train
    : "${MODEL:?the wrapper sets MODEL}"
    : "${MODEL_ID:?the wrapper sets MODEL_ID}"
    : "${VARIANTS:=sft no_ablation no_enhancement real}"
    : "${RECIPE_DIR:=$REPO_ROOT/recipes/$MODEL_ID}"
    : "${EVAL_CONFIG:=$REPO_ROOT/recipes/eval/$MODEL_ID.yaml}"
    : "${ANNOTATORS:=$REPO_ROOT/recipes/annotators/paper.yaml}"
    : "${ACCELERATE_CONFIG:=$REPO_ROOT/accelerate_configs/deepspeed_zero2.yaml}"
    : "${NUM_PROCESSES:=8}"
    : "${MAX_LENGTH:=4096}"
    # extra arguments, appended to the commands (word-split; e.g. TRAIN_ARGS="--max_steps 10")
    : "${TRAIN_ARGS:=}" "${FAE_ARGS:=}" "${PROBE_ARGS:=}"
    # `fae run` runs as one process; with 8 GPUs: FAE="accelerate launch --num_processes 8 -m fae.cli"
    : "${FAE:=fae}"

    # official releases (downloaded by you; see recipes/README.md)
    : "${RAW:=raw}"
    : "${FEVER_TRAIN:=$RAW/fever/train.jsonl}"
    : "${FEVER_TEST:=$RAW/fever/paper_test.jsonl}"
    : "${FEVER_WIKI:=$RAW/fever/wiki-pages}"
    : "${SCIFACT_CLAIMS:=$RAW/scifact/claims_train.jsonl $RAW/scifact/claims_dev.jsonl}"
    : "${SCIFACT_CORPUS:=$RAW/scifact/corpus.jsonl}"
    : "${CLIMATE_FEVER_CLAIMS:=$RAW/climate-fever/climate-fever.jsonl}"
    : "${CHECK_COVID_CLAIMS:=$RAW/check-covid/Check-COVID_all.json}"
    : "${CHECK_COVID_CORPUS:=$RAW/check-covid/corpus.json}"
    # FEVER train; out-of-domain sets: every split the paper uses (SciFact: train + dev)
    : "${TEST_SETS:=fever check-covid scifact climate-fever}"
    : "${NEURONS_SET:=${TEST_SETS%% *}}"
    : "${NEURONS_LIMIT:=500}"
    # every other system is compared with this one (fae compare SYSTEM COMPARE_TO)
    : "${COMPARE_TO:=${VARIANTS##* }}"

    # output roots
    : "${DATA_DIR:=data}" "${OUTPUTS_DIR:=outputs}" "${RUNS_DIR:=runs}"
    : "${PROBES_DIR:=probes}" "${REPORTS_DIR:=reports}"
}

# --- step runner ------------------------------------------------------------
# step DONE_FILE [DONE_FILE...] -- CMD... : print CMD and run it, unless every
# DONE_FILE exists (then the step is complete and skipped).
step() {
    local done_files=() f missing=0
    while [[ $1 != -- ]]; do done_files+=("$1"); shift; done
    shift
    for f in "${done_files[@]}"; do [[ -e $f ]] || missing=1; done
    if [[ $missing == 0 ]]; then
        echo "# done: ${done_files[*]}"
        return 0
    fi
    printf '+'
    printf ' %q' "$@"
    printf '\n'
    [[ $DRY_RUN == 1 ]] && return 0
    "$@"
}

# records file of a test set (the split names what the paper evaluates on)
records_of() {
    case $1 in
        fever) echo "$DATA_DIR/fever-test.jsonl" ;;
        *) echo "$DATA_DIR/$1-all.jsonl" ;;
    esac
}

# convert_set NAME OUTPUT: one official release -> records (SPEC §2)
convert_set() {
    local out=$2
    case $1 in
        fever-train) step "$out" -- real-data convert --dataset fever --claims $FEVER_TRAIN --wiki-pages "$FEVER_WIKI" --output "$out" ;;
        fever) step "$out" -- real-data convert --dataset fever --claims $FEVER_TEST --wiki-pages "$FEVER_WIKI" --output "$out" ;;
        scifact) step "$out" -- real-data convert --dataset scifact --claims $SCIFACT_CLAIMS --corpus "$SCIFACT_CORPUS" --output "$out" ;;
        climate-fever) step "$out" -- real-data convert --dataset climate-fever --claims $CLIMATE_FEVER_CLAIMS --output "$out" ;;
        check-covid) step "$out" -- real-data convert --dataset check-covid --claims $CHECK_COVID_CLAIMS --corpus "$CHECK_COVID_CORPUS" --output "$out" ;;
        *) echo "reproduce: unknown test set '$1' (known: fever check-covid scifact climate-fever)" >&2; return 2 ;;
    esac
}

# the adapter of a system; the base model has none
adapter_args() {
    [[ $1 == base ]] || echo "--adapter $OUTPUTS_DIR/$MODEL_ID/$1"
}

# --- the experiment ---------------------------------------------------------
reproduce_main() {
    DRY_RUN=0
    case ${1:-} in
        --dry-run) DRY_RUN=1 ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; return 0 ;;
        "") ;;
        *) echo "usage: $0 [--dry-run]" >&2; return 2 ;;
    esac
    set -eo pipefail
    _reproduce_settings
    local variant system set records run out
    local systems="base $VARIANTS"
    local train_records="$DATA_DIR/fever-train.jsonl"
    local enhanced="$DATA_DIR/fever-train.enhanced.jsonl"

    echo "# 1. data: official releases -> records"
    convert_set fever-train "$train_records"
    for set in $TEST_SETS; do convert_set "$set" "$(records_of "$set")"; done

    echo "# 2. evidence enhancement of the training claims (cached, resumable)"
    step "$enhanced" -- real-data enhance --records "$train_records" --annotators "$ANNOTATORS" --output "$enhanced"

    echo "# 3. training pairs and one LoRA adapter per variant"
    for variant in $VARIANTS; do
        out="$DATA_DIR/pairs/$MODEL_ID/$variant"
        step "$out/stats.json" -- real-data pairs --records "$enhanced" --variant "$variant" \
            --tokenizer "$MODEL" --max-length "$MAX_LENGTH" --output "$out" --overwrite
    done
    for variant in $VARIANTS; do
        out="$OUTPUTS_DIR/$MODEL_ID/$variant"
        step "$out/adapter_model.safetensors" "$out/train_results.json" -- accelerate launch --config_file "$ACCELERATE_CONFIG" --num_processes "$NUM_PROCESSES" \
            -m real.train --config "$RECIPE_DIR/$variant.yaml" --model_name_or_path "$MODEL" \
            --dataset_name "$DATA_DIR/pairs/$MODEL_ID/$variant" --output_dir "$out" $TRAIN_ARGS
    done

    echo "# 4. FAE (R = 4) and DirK probes: the base model and every adapter on every test set"
    for set in $TEST_SETS; do
        records=$(records_of "$set")
        for system in $systems; do
            run="$RUNS_DIR/$MODEL_ID/$system/$set"
            step "$run/metrics.json" -- $FAE run --config "$EVAL_CONFIG" --model "$MODEL" $(adapter_args "$system") \
                --records "$records" --output "$run" $FAE_ARGS
            out="$PROBES_DIR/$MODEL_ID/$system/$set"
            step "$out/dirk.json" -- fae probe --run "$run" --model "$MODEL" $(adapter_args "$system") \
                --output "$out" $PROBE_ARGS
        done
    done
    out="$PROBES_DIR/$MODEL_ID/base/neurons-$NEURONS_SET"
    step "$out/neurons.md" -- fae neurons --records "$(records_of "$NEURONS_SET")" --model "$MODEL" \
        --limit "$NEURONS_LIMIT" --output "$out"

    echo "# 5. reports: Table 1 + trajectories, DirK figure, score accounting against REAL"
    local runs probes last=$COMPARE_TO
    for set in $TEST_SETS; do
        out="$REPORTS_DIR/$MODEL_ID/$set"
        runs=() probes=()
        for system in $systems; do
            runs+=("$RUNS_DIR/$MODEL_ID/$system/$set")
            probes+=("$PROBES_DIR/$MODEL_ID/$system/$set")
        done
        step "$out/report.md" "$out/trajectory.png" -- fae report "${runs[@]}" --names $systems --output "$out"
        step "$out/dirk/dirk.md" -- fae probe-report "${probes[@]}" --labels $systems --output "$out/dirk"
        for system in $systems; do
            [[ $system == "$last" ]] && continue
            step "$out/$system-vs-$last/compare.md" -- fae compare "$RUNS_DIR/$MODEL_ID/$system/$set" \
                "$RUNS_DIR/$MODEL_ID/$last/$set" --output "$out/$system-vs-$last"
        done
    done
    if [[ $DRY_RUN == 1 ]]; then echo "# dry run: nothing was executed"; else echo "# all steps done"; fi
}
