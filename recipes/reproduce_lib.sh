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
    # the Python that the prerequisite check asks for the extras (and that writes the step times): the one
    # whose console scripts (real-data, fae, real-train) run the steps
    : "${PYTHON:=python3}"

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
    : "${TRAIN_ARGS:=}" "${FAE_ARGS:=}" "${PROBE_ARGS:=}" "${PAIRS_ARGS:=}"
    # `fae run` runs as one process; with 8 GPUs: FAE="accelerate launch --num_processes 8 -m fae.cli"
    : "${FAE:=fae}"

    # what is trained on and how: TRAIN_SET names the converted training split; ENHANCE=0 skips the
    # annotator vote (then only sft and no_enhancement can be trained); CONVERT_ARGS go to every convert
    : "${TRAIN_SET:=fever-train}"
    : "${ENHANCE:=1}"
    : "${CONVERT_ARGS:=}"
    # extra `fae run` flags for the base model alone (e.g. --constrained-decoding for a base that writes prose)
    : "${BASE_FAE_ARGS:=}"
    # PAVE (`fae pave`) per system on these test sets (empty: none) and its flags
    : "${PAVE_SETS:=}" "${PAVE_ARGS:=}"
    # PAVE's misleading evidence: `real-data counterfactual` on each PAVE set. entity = rule-based value
    # swaps, kept where the rule proves the flip (no model needed); semantic (and unproved entity swaps) need
    # an LLM rewriter/judge: COUNTERFACTUAL_KINDS="entity semantic" COUNTERFACTUAL_ARGS="--annotators FILE"
    : "${COUNTERFACTUAL_KINDS:=entity}" "${COUNTERFACTUAL_ARGS:=}" "${AUDIT_SIZE:=100}"
    # `fae checkpoints` (FAE of every saved checkpoint) for these variants on the first test set
    : "${CHECKPOINT_VARIANTS:=}" "${CHECKPOINT_ARGS:=}"

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
    # single splits (TRAIN_SET / TEST_SETS named <dataset>-<split>)
    : "${CHECK_COVID_TRAIN:=$RAW/check-covid/covidCheck_train_composed+extracted.json}"
    : "${CHECK_COVID_DEV:=$RAW/check-covid/covidCheck_dev_composed+extracted.json}"
    : "${CHECK_COVID_TEST:=$RAW/check-covid/covidCheck_test_composed.json $RAW/check-covid/covidCheck_test_extracted.json}"
    : "${SCIFACT_TRAIN:=$RAW/scifact/claims_train.jsonl}" "${SCIFACT_DEV:=$RAW/scifact/claims_dev.jsonl}"
    # FEVER train; out-of-domain sets: every split the paper uses (SciFact: train + dev)
    : "${TEST_SETS:=fever check-covid scifact climate-fever}"
    : "${NEURONS_SET:=${TEST_SETS%% *}}"
    : "${NEURONS_LIMIT:=500}"
    # every other system is compared with this one (fae compare SYSTEM COMPARE_TO)
    : "${COMPARE_TO:=${VARIANTS##* }}"

    # output roots
    : "${DATA_DIR:=data}" "${OUTPUTS_DIR:=outputs}" "${RUNS_DIR:=runs}"
    : "${PROBES_DIR:=probes}" "${REPORTS_DIR:=reports}" "${PAVE_DIR:=pave}"
    # free disk the whole run needs, checked before the first step (an 8B run: weights, checkpoints, runs)
    : "${MIN_FREE_GB:=50}"
    # one JSON line per step that ran: its command and wall seconds (the experiment's timing table)
    : "${STEP_TIMES:=$REPORTS_DIR/$MODEL_ID/step_times.jsonl}"
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
    local t0=$SECONDS
    "$@"
    mkdir -p "$(dirname "$STEP_TIMES")"
    "$PYTHON" -c 'import json, sys; print(json.dumps({"done": sys.argv[1], "seconds": int(sys.argv[2]), "command": sys.argv[3:]}))' \
        "${done_files[0]}" "$((SECONDS - t0))" "$@" >> "$STEP_TIMES"
}

# --- prerequisites, all checked before the first step --------------------------
# raw_files_of SET: the official files `convert_set SET` reads
raw_files_of() {
    case $1 in
        fever-train) echo "$FEVER_TRAIN $FEVER_WIKI" ;;
        fever) echo "$FEVER_TEST $FEVER_WIKI" ;;
        scifact) echo "$SCIFACT_CLAIMS $SCIFACT_CORPUS" ;;
        scifact-train) echo "$SCIFACT_TRAIN $SCIFACT_CORPUS" ;;
        scifact-dev) echo "$SCIFACT_DEV $SCIFACT_CORPUS" ;;
        climate-fever) echo "$CLIMATE_FEVER_CLAIMS" ;;
        check-covid) echo "$CHECK_COVID_CLAIMS $CHECK_COVID_CORPUS" ;;
        check-covid-train) echo "$CHECK_COVID_TRAIN $CHECK_COVID_CORPUS" ;;
        check-covid-dev) echo "$CHECK_COVID_DEV $CHECK_COVID_CORPUS" ;;
        check-covid-test) echo "$CHECK_COVID_TEST $CHECK_COVID_CORPUS" ;;
    esac
}

# preflight: every problem a later step would stop on (a missing extra, data file, recipe, disk), all at
# once, before anything runs: a run must not stop after an hour of training on what was known at the start.
# A missing package is named with the one install line that installs everything this run needs.
preflight() {
    local problems=() set f needs=() need module extra why variant free_kb extras install
    # extras: what the settings ask for, as MODULE:EXTRA:WHY
    local fae_flags="$FAE_ARGS $BASE_FAE_ARGS $PAVE_ARGS $CHECKPOINT_ARGS"
    [[ $fae_flags == *--constrained-decoding* ]] && needs+=("xgrammar:structured:--constrained-decoding with the hf backend")
    grep -qs "distributed_type: DEEPSPEED" "$ACCELERATE_CONFIG" && needs+=("deepspeed:deepspeed:$ACCELERATE_CONFIG")
    for need in ${MODEL_NEEDS:-}; do  # a wrapper's own needs, MODULE:EXTRA (e.g. gguf:gguf for a GGUF import)
        needs+=("$need:the base model's set-up (prepare_model)")
    done
    extras=$(for need in "${needs[@]}"; do cut -d: -f2 <<< "$need"; done | sort -u | paste -sd, -)
    install="pip install torch==2.13.0 -e \"$REPO_ROOT${extras:+[$extras]}\""
    command -v real-data > /dev/null || problems+=("real-fae is not installed: $install")
    command -v accelerate > /dev/null || problems+=("accelerate is not installed: $install")
    for need in "${needs[@]}"; do
        IFS=: read -r module extra why <<< "$need"
        "$PYTHON" -c "import $module" > /dev/null 2>&1 \
            || problems+=("the Python package '$module' (extra [$extra], needed by $why) is missing from $PYTHON; $install installs everything this script runs")
    done
    [[ -f $ACCELERATE_CONFIG ]] || problems+=("ACCELERATE_CONFIG $ACCELERATE_CONFIG: no such file")
    [[ -f $EVAL_CONFIG ]] || problems+=("EVAL_CONFIG $EVAL_CONFIG: no such file")
    for variant in $VARIANTS; do
        [[ -f $RECIPE_DIR/$variant.yaml ]] || problems+=("recipe $RECIPE_DIR/$variant.yaml: no such file (VARIANTS=$VARIANTS)")
    done
    [[ $ENHANCE == 0 || -f $ANNOTATORS || -f $DATA_DIR/$TRAIN_SET.enhanced.jsonl ]] \
        || problems+=("ANNOTATORS $ANNOTATORS: no such file (or ENHANCE=0 to train on gold evidence)")
    # data: the raw files of every set whose records are not converted yet
    for set in $TRAIN_SET $TEST_SETS; do
        [[ $set == "$TRAIN_SET" ]] && f="$DATA_DIR/$TRAIN_SET.jsonl" || f=$(records_of "$set")
        [[ -e $f ]] && continue
        for f in $(raw_files_of "$set"); do
            [[ -e $f ]] || problems+=("data set $set: $f not found (RAW=$RAW; recipes/README.md lists the files)")
        done
    done
    free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
    (( free_kb >= MIN_FREE_GB * 1024 * 1024 )) \
        || problems+=("only $((free_kb / 1024 / 1024)) GB free in $PWD; the run needs about $MIN_FREE_GB GB (MIN_FREE_GB)")
    (( ${#problems[@]} == 0 )) && { echo "# prerequisites: all present"; return 0; }
    if [[ $DRY_RUN == 1 ]]; then
        printf 'reproduce: %s\n' "${problems[@]}" >&2
        echo "# prerequisites: ${#problems[@]} missing (listed on stderr); a real run would stop here"
        return 0
    fi
    if (( ${#problems[@]} == 1 )); then  # one line: what is missing, and how to get it
        echo "reproduce: ${problems[0]}; nothing was run" >&2
        return 2
    fi
    printf 'reproduce: %s\n' "${problems[@]}" >&2
    echo "reproduce: ${#problems[@]} prerequisite(s) missing; nothing was run" >&2
    return 2
}

# records file of a test set (the split names what the paper evaluates on)
records_of() {
    case $1 in
        fever) echo "$DATA_DIR/fever-test.jsonl" ;;
        *-train | *-dev | *-test) echo "$DATA_DIR/$1.jsonl" ;;
        *) echo "$DATA_DIR/$1-all.jsonl" ;;
    esac
}

# convert_set NAME OUTPUT: one official release -> records (SPEC §2)
convert_set() {
    local out=$2
    case $1 in
        fever-train) step "$out" -- real-data convert --dataset fever --claims $FEVER_TRAIN --wiki-pages "$FEVER_WIKI" --output "$out" $CONVERT_ARGS ;;
        fever) step "$out" -- real-data convert --dataset fever --claims $FEVER_TEST --wiki-pages "$FEVER_WIKI" --output "$out" $CONVERT_ARGS ;;
        scifact) step "$out" -- real-data convert --dataset scifact --claims $SCIFACT_CLAIMS --corpus "$SCIFACT_CORPUS" --output "$out" $CONVERT_ARGS ;;
        scifact-train) step "$out" -- real-data convert --dataset scifact --claims $SCIFACT_TRAIN --corpus "$SCIFACT_CORPUS" --output "$out" $CONVERT_ARGS ;;
        scifact-dev) step "$out" -- real-data convert --dataset scifact --claims $SCIFACT_DEV --corpus "$SCIFACT_CORPUS" --output "$out" $CONVERT_ARGS ;;
        climate-fever) step "$out" -- real-data convert --dataset climate-fever --claims $CLIMATE_FEVER_CLAIMS --output "$out" $CONVERT_ARGS ;;
        check-covid) step "$out" -- real-data convert --dataset check-covid --claims $CHECK_COVID_CLAIMS --corpus "$CHECK_COVID_CORPUS" --output "$out" $CONVERT_ARGS ;;
        check-covid-train) step "$out" -- real-data convert --dataset check-covid --claims $CHECK_COVID_TRAIN --corpus "$CHECK_COVID_CORPUS" --output "$out" $CONVERT_ARGS ;;
        check-covid-dev) step "$out" -- real-data convert --dataset check-covid --claims $CHECK_COVID_DEV --corpus "$CHECK_COVID_CORPUS" --output "$out" $CONVERT_ARGS ;;
        check-covid-test) step "$out" -- real-data convert --dataset check-covid --claims $CHECK_COVID_TEST --corpus "$CHECK_COVID_CORPUS" --output "$out" $CONVERT_ARGS ;;
        *) echo "reproduce: unknown data set '$1' (known: fever-train fever check-covid[-train|-dev|-test] scifact[-train|-dev] climate-fever)" >&2; return 2 ;;
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
    local train_records="$DATA_DIR/$TRAIN_SET.jsonl"
    local enhanced="$DATA_DIR/$TRAIN_SET.enhanced.jsonl"
    if [[ $ENHANCE == 0 ]]; then
        # the variants that need no annotator vote, from the one registry (data_prep/pairs/build.py)
        local plain
        plain=$("${PYTHON:-python3}" -c 'from data_prep.pairs.build import VARIANTS
print(" ".join(name for name, v in VARIANTS.items() if not v.enhanced))') || {
            echo "reproduce: cannot read the variant registry with ${PYTHON:-python3} (is the project installed?)" >&2
            return 2
        }
        for variant in $VARIANTS; do
            case " $plain " in *" $variant "*) ;; *)
                echo "reproduce: variant '$variant' trains on enhanced evidence, but ENHANCE=0 (train one of: $plain)" >&2
                return 2 ;;
            esac
        done
        enhanced=$train_records
    fi
    preflight || return $?
    # a wrapper may define prepare_model: the base model's own set-up (e.g. a GGUF import)
    if declare -F prepare_model > /dev/null; then
        echo "# 0. the base model"
        prepare_model
    fi

    echo "# 1. data: official releases -> records"
    convert_set "$TRAIN_SET" "$train_records"
    for set in $TEST_SETS; do convert_set "$set" "$(records_of "$set")"; done

    if [[ $ENHANCE != 0 ]]; then
        echo "# 2. evidence enhancement of the training claims (cached, resumable)"
        step "$enhanced" -- real-data enhance --records "$train_records" --annotators "$ANNOTATORS" --output "$enhanced"
    else
        echo "# 2. no evidence enhancement (ENHANCE=0): pairs from the gold evidence"
    fi

    echo "# 3. training pairs and one LoRA adapter per variant"
    for variant in $VARIANTS; do
        out="$DATA_DIR/pairs/$MODEL_ID/$variant"
        step "$out/stats.json" -- real-data pairs --records "$enhanced" --variant "$variant" \
            --tokenizer "$MODEL" --max-length "$MAX_LENGTH" --output "$out" --overwrite $PAIRS_ARGS
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
                --records "$records" --output "$run" $FAE_ARGS $([[ $system == base ]] && echo "$BASE_FAE_ARGS")
            out="$PROBES_DIR/$MODEL_ID/$system/$set"
            step "$out/dirk.json" -- fae probe "$run" --model "$MODEL" $(adapter_args "$system") \
                --output "$out" $PROBE_ARGS
        done
    done
    if [[ $NEURONS_LIMIT != 0 ]]; then
        out="$PROBES_DIR/$MODEL_ID/base/neurons-$NEURONS_SET"
        step "$out/neurons.md" -- fae neurons --records "$(records_of "$NEURONS_SET")" --model "$MODEL" \
            --limit "$NEURONS_LIMIT" --output "$out"
    fi
    if [[ -n $PAVE_SETS ]]; then
        echo "# 4b. PAVE: counterfactual evidence for the test claims, its audit sheets, then prior states,"
        echo "#     Margin/PR/CR (with 95% intervals) and arbitration per system"
        [[ $COUNTERFACTUAL_KINDS == *semantic* ]] || echo "# counterfactual kinds: $COUNTERFACTUAL_KINDS only; the semantic kind needs an LLM rewriter and judge (COUNTERFACTUAL_KINDS=\"entity semantic\" COUNTERFACTUAL_ARGS=\"--annotators FILE\"), none is configured"
        for set in $PAVE_SETS; do
            local cf="$DATA_DIR/$set.counterfactual.jsonl"
            step "$cf" -- real-data counterfactual --records "$(records_of "$set")" --output "$cf" \
                --kinds $COUNTERFACTUAL_KINDS --no-progress $COUNTERFACTUAL_ARGS
            # the human audit (the paper's M = 100 instances, three raters): blank sheets to fill in
            out="$REPORTS_DIR/$MODEL_ID/counterfactual-audit-$set"
            step "$out/audit.json" -- real-data counterfactual-audit --records "$cf" --output "$out" --size "$AUDIT_SIZE"
            for system in $systems; do
                out="$PAVE_DIR/$MODEL_ID/$system/$set"
                step "$out/pave.json" -- fae pave --records "$cf" --model "$MODEL" $(adapter_args "$system") \
                    --output "$out" --check-run "$RUNS_DIR/$MODEL_ID/$system/$set" $PAVE_ARGS $([[ $system == base ]] && echo "$BASE_FAE_ARGS" | grep -o -- --constrained-decoding)
            done
        done
    fi
    for variant in $CHECKPOINT_VARIANTS; do
        set=${TEST_SETS%% *}
        out="$REPORTS_DIR/$MODEL_ID/checkpoints-$variant-$set"
        step "$out/checkpoints.json" -- fae checkpoints --training-output "$OUTPUTS_DIR/$MODEL_ID/$variant" \
            --records "$(records_of "$set")" --config "$EVAL_CONFIG" --model "$MODEL" --output "$out" $CHECKPOINT_ARGS
    done

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
        step "$out/dirk/dirk.md" -- fae probe-report "${probes[@]}" --names $systems --output "$out/dirk"
        for system in $systems; do
            [[ $system == "$last" ]] && continue
            # a base audited under the answer grammar is compared with free answers on purpose
            step "$out/$system-vs-$last/compare.md" -- fae compare "$RUNS_DIR/$MODEL_ID/$system/$set" \
                "$RUNS_DIR/$MODEL_ID/$last/$set" --output "$out/$system-vs-$last" \
                $([[ $system == base && $BASE_FAE_ARGS == *--constrained-decoding* ]] && echo --allow-mixed-decoding)
        done
    done
    echo "# 6. one summary of the experiment (Table-1 columns, soft FAE, DirK, PAVE, step times)"
    if [[ $DRY_RUN != 1 ]]; then
        "$PYTHON" "$REPO_ROOT/recipes/summarize.py" --model-id "$MODEL_ID" --systems $systems --sets $TEST_SETS \
            --output "$REPORTS_DIR/$MODEL_ID/summary.json"
    fi
    if [[ $DRY_RUN == 1 ]]; then echo "# dry run: nothing was executed"; else echo "# all steps done"; fi
}
