"""`fae probe` as a library: DirK hidden-state probe over a finished FAE run (SPEC §7).

:func:`run` takes a :class:`ProbeConfig` (the command's config: the dispatcher generates its parser); the
command, the demo and Python callers call it, and `fae view` reads a run's records with :func:`resolve_records`.
Importing it loads no torch (``fae --help`` builds its parser): the hidden states are captured inside the run.

For every claim of the run it rebuilds the round-r evidence prompt from the
pool ids the run recorded, plus the claim-only knowledge prompt, captures the
hidden state at the last prompt token (right before the first generated
token) and computes ``DirK(r) = cos(h(r) - h(0), h(K) - h(0))`` for r >= 1,
with a percentile-bootstrap CI over claims.

It also answers every claim-only prompt (greedy) and reports the label
shares: when the reference mostly answers NOT_ENOUGH_INFO, ``h(K)`` is an
abstention state and DirK measures drift toward abstaining; ``dirk.json``
flags it. ``--knowledge-reference base`` takes ``h(K)`` from the base model
without the adapter (the direction toward parametric knowledge).

Outputs (in ``--output``): ``dirk.json`` (per-round mean, CI, counts, the
knowledge-prompt answers), ``dirk_claims.jsonl`` (per-claim values) and
``states.safetensors`` (the states that reproduce both).
"""

from __future__ import annotations

from dataclasses import dataclass
import json
import sys
from pathlib import Path

import numpy as np

from real_fae_core.atomicio import atomic_file, atomic_open, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, field_names, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import Output, claim_dir, only_names
from real_fae_core.runlock import RunLock
from data_prep.prompts import DEFAULT_LINE_IDS, parse_answer, render_evidence_prompt, render_knowledge_prompt
from data_prep.records import RecordError, load_records
from fae.ablation.runio import CLAIMS, RunData, load_run, resolve_records
from fae.backends import ANSWER_MAX_NEW_TOKENS
from fae.backends.hf import generate_batched, greedy_config, load_hf_model
from fae.probes.dirk import dirk_values, summarize_rounds
from fae.probes.knowledge import abstaining, invalid_reference, label_shares, reference_note, shares_text
from fae.backends.options import HFLoadFields
from fae.intervals import MAX_DRAWS

STATES_DTYPES = ("float16", "float32")
KNOWLEDGE_REFERENCES = ("verifier", "base")


@dataclass
class ProbeFields:
    """`fae probe`'s own options (the hf backend's loading options follow in :class:`ProbeConfig`)."""

    run_dir: str = option(positional=True, metavar="RUN_DIR", deprecated=("--run",),
                          help="FAE run directory (claims.jsonl, config.json)")
    model: str = option(help="base model directory (HF format)")
    output: str = option(help="directory for dirk.json, dirk_claims.jsonl, states")
    adapter: str | None = option(None, help="optional PEFT/LoRA adapter directory")
    records: str | None = option(None, help="records JSONL (default: the path in the run's config.json)")
    layer: int = option(-1, help="index into hidden_states: -1 = last layer after the final norm (SPEC §7), "
                                 "0 = embeddings, i = output of layer i (default -1)")
    bootstrap: int = option(2000, min=0, max=MAX_DRAWS, help=f"bootstrap resamples, 0 to {MAX_DRAWS} (default 2000)")
    seed: int = option(0, min=0, help="bootstrap seed (default 0)")
    batch_size: int = option(8, min=1, help="prompts per forward pass (default 8)")
    limit: int | None = option(None, min=1, help="probe only the first N claims")
    states_dtype: str = option("float16", choices=STATES_DTYPES, help="dtype of states.safetensors (default float16)")
    knowledge_reference: str = option(
        "verifier", choices=KNOWLEDGE_REFERENCES,
        help="whose state on the claim-only prompt is h(K): the probed verifier (default, SPEC §7) or the base "
             "model without --adapter (the direction toward parametric knowledge; without --adapter the verifier "
             "is the base, the same h(K))")
    knowledge_max_new_tokens: int | None = option(None, min=1, help="tokens of the greedy answer to each claim-only "
                                                  "prompt (default: the run's max_new_tokens, else 64)")


@dataclass
class ProbeConfig(HFLoadFields, ProbeFields, CommandConfig):
    """`fae probe`: DirK over a finished FAE run."""

    # the probe's own options, then the hf backend's loading options as `fae run --backend hf` has them (under
    # its heading: their fields' `group`)
    COMMAND_FIELDS = field_names(ProbeFields, HFLoadFields)


FP16_MAX = 65504.0
STATES_FORMAT = "fae-probe-states/1"


# ---------------------------------------------------------------------------
# Reading an FAE run
# ---------------------------------------------------------------------------

def probe_claims(data: RunData, limit: int | None = None) -> list[dict]:
    """The run's claims (the first ``limit``), checked for the fields the probe needs."""
    claims = data.claims[:limit] if limit is not None else data.claims
    if not claims:
        raise UserError(f"{data.path / CLAIMS}: no claims")
    for c in claims:
        rounds = c.get("rounds")
        if not isinstance(rounds, list) or not rounds:
            raise data.claim_error(c, "rounds", "missing or empty")
        for k, rd in enumerate(rounds):
            pids = rd.get("pool_ids") if isinstance(rd, dict) else None
            if not isinstance(pids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in pids
            ):
                raise data.claim_error(c, f"rounds[{k}].pool_ids", "must be a list of sentence ids")
            if rd.get("round", k) != k:
                raise data.claim_error(c, f"rounds[{k}].round", f"expected {k}, got {rd.get('round')!r}")
    return claims


def build_prompts(claims: list[dict], records: dict, data: RunData):
    """Per claim: [knowledge prompt, round-0 prompt, ..., round-R prompt], lines numbered as the run showed
    them (its config's ``line_ids``: the states probed are those of the prompts FAE asked)."""
    line_ids = (data.config or {}).get("line_ids") or DEFAULT_LINE_IDS
    out = []
    for c in claims:
        rec = records.get(str(c["id"]))
        if rec is None:
            raise UserError(f"{data.path / CLAIMS}:{data.line_of.get(str(c['id']), '?')}: "
                            f"claim {c['id']!r} is not in the records file")
        msgs = [render_knowledge_prompt(rec)]
        for k, rd in enumerate(c["rounds"]):
            try:
                msgs.append(render_evidence_prompt(rec, rd["pool_ids"], line_ids))
            except ValueError as exc:
                raise data.claim_error(c, f"rounds[{k}].pool_ids", str(exc)) from None
        out.append(msgs)
    return out


def knowledge_labels(model, tok, seqs: list[list[int]], batch_size: int, max_new_tokens: int) -> list[str | None]:
    """The greedy label of each claim-only prompt (None for an answer that does not parse)."""
    gens = generate_batched(model, tok, seqs, greedy_config(model, tok, max_new_tokens), batch_size)
    out = []
    for g in gens:
        parsed = parse_answer(g.text, [])
        out.append(parsed.label if parsed.valid else None)
    return out


# ---------------------------------------------------------------------------
# DirK from states
# ---------------------------------------------------------------------------

def dirk_table(hK: np.ndarray, hr: np.ndarray, round_mask: np.ndarray) -> list[list[float | None]]:
    """Per-claim DirK lists ``[None, d1, ..., dR]`` from ``hK [N,D]``, ``hr [N,R+1,D]``."""
    vals, defined = dirk_values(hr, hr[:, :1, :], hK[:, None, :])
    table = []
    for i in range(hr.shape[0]):
        n_i = int(round_mask[i].sum())
        row: list[float | None] = [None]
        for r in range(1, n_i):
            row.append(float(vals[i, r]) if defined[i, r] else None)
        table.append(row)
    return table


def save_states(path: Path, ids, hK, hr, round_mask, meta: dict, dtype: str) -> str:
    """states.safetensors; falls back to float32 when float16 would overflow."""
    import torch
    from safetensors.torch import save_file

    big = max(float(np.abs(hK).max(initial=0.0)), float(np.abs(hr).max(initial=0.0)))
    if dtype == "float16" and big > FP16_MAX:
        print(f"fae probe: warning: |h| reaches {big:.3g} > float16 max; saving float32",
              file=sys.stderr)
        dtype = "float32"
    tdt = torch.float16 if dtype == "float16" else torch.float32
    tensors = {
        "hK": torch.from_numpy(np.ascontiguousarray(hK)).to(tdt),
        "hr": torch.from_numpy(np.ascontiguousarray(hr)).to(tdt),
        "round_mask": torch.from_numpy(round_mask.astype(np.uint8)),
    }
    metadata = {"format": STATES_FORMAT, "ids": json.dumps(list(ids)), "dtype": dtype}
    metadata.update({k: json.dumps(v) for k, v in meta.items()})
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return dtype


def load_states(path: str | Path) -> dict:
    """``{"ids", "hK", "hr", "round_mask", "meta"}`` as float64 numpy arrays."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        if meta.get("format") != STATES_FORMAT:
            raise UserError(f"{path}: not a fae probe states file")
        out = {k: fh.get_tensor(k) for k in ("hK", "hr", "round_mask")}
    return {
        "ids": json.loads(meta["ids"]),
        "hK": out["hK"].double().numpy(),
        "hr": out["hr"].double().numpy(),
        "round_mask": out["round_mask"].numpy().astype(bool),
        "meta": meta,
    }


def _same_path(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    pa, pb = Path(str(a)), Path(str(b))
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return str(a) == str(b)


def _warn_if_other_verifier(cfg: dict, config: ProbeConfig) -> None:
    """Probing another checkpoint than the one the run evaluated is allowed, but say so."""
    if cfg.get("backend", "hf") != "hf":
        return
    if not _same_path(cfg.get("model"), config.model) or not _same_path(cfg.get("adapter"), config.adapter):
        print(f"fae probe: note: the run evaluated model={cfg.get('model')!r} "
              f"adapter={cfg.get('adapter')!r}; probing model={config.model!r} "
              f"adapter={config.adapter!r}", file=sys.stderr)


def _fmt(x) -> str:
    return "  n/a" if x is None else f"{x:+.3f}"


def run(config: ProbeConfig) -> CommandResult:
    """`fae probe` as a function: DirK of a finished FAE run's claims in ``config.output``; an unfinished run,
    a bad choice or an output that is a file is one :class:`UserError`."""
    run_dir = Path(config.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"RUN_DIR {config.run_dir!r}: directory not found")
    if config.states_dtype not in STATES_DTYPES:
        raise UserError(f"--states-dtype must be one of {', '.join(STATES_DTYPES)}, got {config.states_dtype!r}")
    if config.knowledge_reference not in KNOWLEDGE_REFERENCES:
        raise UserError(f"--knowledge-reference must be one of {', '.join(KNOWLEDGE_REFERENCES)}, "
                        f"got {config.knowledge_reference!r}")
    data = load_run(run_dir)  # refuses unfinished runs and stale metrics.json
    out = Path(config.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; give a directory")
    claim_dir(out, "fae probe", inputs=[config.run_dir, config.records, config.adapter,
                                        config.model if Path(config.model).exists() else None],
              legacy=only_names("dirk.json", "dirk_claims.jsonl", "states.safetensors"))
    with RunLock(out, "fae probe", is_dir=True):
        return _probe(config, data, out)


def _probe(config: ProbeConfig, data: RunData, out: Path) -> CommandResult:
    run_dir, cfg = data.path, data.config
    records_path = resolve_records(run_dir, cfg, config.records)
    try:
        records = {r.id: r for r in load_records(records_path)}
    except RecordError as exc:
        raise UserError(str(exc)) from None
    _warn_if_other_verifier(cfg, config)
    claims = probe_claims(data, config.limit)
    cap = _capture_states(config, build_prompts(claims, records, data), data)
    hK, hr, mask = _state_arrays(claims, cap)
    table = dirk_table(hK, hr, mask)
    rounds = summarize_rounds(table, hr.shape[1] - 1, n_resamples=config.bootstrap, seed=config.seed)

    Output(out, "fae probe").mark()
    meta = {
        "run": str(run_dir),
        "model": str(config.model),
        "adapter": None if config.adapter is None else str(config.adapter),
        "layer": config.layer,
        "knowledge_reference": config.knowledge_reference,
    }
    knowledge = _knowledge_section(config, claims, cap)
    saved_dtype = save_states(out / "states.safetensors", [str(c["id"]) for c in claims],
                              hK, hr, mask, meta, config.states_dtype)
    _write_claim_lines(out / "dirk_claims.jsonl", claims, table, cap)
    summary = {
        **meta,
        "records": str(records_path),
        "records_sha256": cfg.get("records_sha256"),
        "run_model": cfg.get("model"),
        "run_adapter": cfg.get("adapter"),
        "hidden_states": "hidden_states[layer] at the last prompt token (after the "
                         "generation prompt), layer -1 = after the final norm",
        "n_claims": len(claims),
        "n_prompts": cap.n_prompts,
        "n_unique_prompts": cap.n_unique,
        "bootstrap": {"method": "percentile", "n_resamples": config.bootstrap,
                      "confidence_level": 0.95, "seed": config.seed},
        "undefined": "a round whose state equals h(0) (unchanged pool) has no direction: "
                     "value null, counted in n_undefined, excluded from mean and CI; "
                     "round 0 is undefined by definition and not listed",
        "states": {"file": "states.safetensors", "dtype": saved_dtype},
        **knowledge,
        "rounds": rounds,
    }
    atomic_write_text(out / "dirk.json", json.dumps(summary, indent=2) + "\n")
    _print_summary(config, out, summary, cap)
    outputs = {"dirk": str(out / "dirk.json"), "claims": str(out / "dirk_claims.jsonl"),
               "states": str(out / "states.safetensors")}
    return CommandResult(outputs=outputs, summary=summary)


@dataclass
class _Captured:
    """What the models gave: the verifier's states of every prompt, the claim-only answers, h(K) from the base."""

    states: np.ndarray  # (prompts, dim): per claim its claim-only prompt, then one per round
    n_prompts: int
    n_unique: int
    max_new: int
    verifier_labels: list
    reference_labels: list
    reference_states: np.ndarray | None  # --knowledge-reference base: the base's claim-only states


def _capture_states(config: ProbeConfig, prompts: list, data: RunData) -> _Captured:
    """Hidden states of every prompt (one model in memory at a time) and the greedy claim-only answers."""
    from fae.probes.hidden import capture_last_token_states, check_layer, encode_prompts  # torch: here only

    model, tok = load_hf_model(config.model, config.adapter, device=config.device, dtype=config.dtype,
                               trust_remote_code=config.trust_remote_code)
    check_layer(model, config.layer)
    seqs = encode_prompts(tok, [m for msgs in prompts for m in msgs])
    states = capture_last_token_states(
        model, seqs, pad_id=tok.pad_token_id, layers=config.layer,
        batch_size=config.batch_size, progress=True, desc="fae probe",
    ).double().numpy()
    max_new = int(config.knowledge_max_new_tokens or (data.config.get("decoding") or {}).get("max_new_tokens") or ANSWER_MAX_NEW_TOKENS)
    knowledge_seqs = encode_prompts(tok, [msgs[0] for msgs in prompts])
    verifier_labels = knowledge_labels(model, tok, knowledge_seqs, config.batch_size, max_new)
    cap = _Captured(states, len(seqs), len({tuple(s) for s in seqs}), max_new, verifier_labels, verifier_labels,
                    None)
    if config.knowledge_reference == "base" and config.adapter is not None:  # else the verifier is the base
        del model  # one model in memory at a time
        base, base_tok = load_hf_model(config.model, None, device=config.device, dtype=config.dtype,
                                       trust_remote_code=config.trust_remote_code)
        base_seqs = encode_prompts(base_tok, [msgs[0] for msgs in prompts])
        cap.reference_states = capture_last_token_states(
            base, base_seqs, pad_id=base_tok.pad_token_id, layers=config.layer,
            batch_size=config.batch_size, progress=True, desc="fae probe (base h(K))",
        ).double().numpy()
        cap.reference_labels = knowledge_labels(base, base_tok, base_seqs, config.batch_size, max_new)
    return cap


def _state_arrays(claims: list[dict], cap: _Captured) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h(K) per claim, h(r) per claim and round, which rounds exist) from the flat states."""
    n, max_rounds, dim = len(claims), max(len(c["rounds"]) for c in claims), cap.states.shape[1]
    hK = np.zeros((n, dim))
    hr = np.zeros((n, max_rounds, dim))
    mask = np.zeros((n, max_rounds), dtype=bool)
    k = 0
    for i, c in enumerate(claims):
        nr = len(c["rounds"])
        hK[i] = cap.states[k] if cap.reference_states is None else cap.reference_states[i]
        hr[i, :nr] = cap.states[k + 1:k + 1 + nr]
        mask[i, :nr] = True
        k += 1 + nr
    return hK, hr, mask


def _knowledge_section(config: ProbeConfig, claims: list[dict], cap: _Captured) -> dict:
    """dirk.json's account of h(K): whose state it is, its claim-only answers, and whether it abstains."""
    gold = [c.get("gold_label") for c in claims]
    base = cap.reference_states is not None
    if base:
        whose = ("base: h(K) is the base model's state (without the adapter) on the claim-only prompt, "
                 "the direction toward parametric knowledge")
    elif config.knowledge_reference == "base":  # no adapter: the same h(K) as every adapter's base reference
        whose = ("base: the verifier is the base model (no adapter), so h(K) is its own state on the claim-only "
                 "prompt, the same reference as its adapters' `--knowledge-reference base`")
    else:
        whose = "verifier: h(K) is the probed checkpoint's state on the claim-only prompt (SPEC §7)"
    knowledge = {
        "knowledge_reference_model": whose,
        "knowledge_answers": {
            "decoding": {"greedy": True, "max_new_tokens": cap.max_new},
            "verifier": label_shares(cap.verifier_labels, gold),
            **({"reference": label_shares(cap.reference_labels, gold)} if base else {}),
        },
    }
    ref_summary = label_shares(cap.reference_labels, gold)
    knowledge["abstaining_reference"] = abstaining(ref_summary)
    knowledge["invalid_reference"] = invalid_reference(ref_summary)
    knowledge["reference_note"] = reference_note(ref_summary, config.knowledge_reference)
    return knowledge


def _write_claim_lines(path: Path, claims: list[dict], table, cap: _Captured) -> None:
    """dirk_claims.jsonl: per claim its DirK by round, pools, labels and claim-only answers."""
    with atomic_open(path) as fh:
        for k, (c, row) in enumerate(zip(claims, table)):
            fh.write(json.dumps({
                "id": str(c["id"]),
                "gold_label": c.get("gold_label"),
                "dirk": row,
                "undefined_rounds": [r for r in range(1, len(row)) if row[r] is None],
                "pool_sizes": [len(rd["pool_ids"]) for rd in c["rounds"]],
                "labels": [rd.get("label") for rd in c["rounds"]],
                "knowledge_label": cap.verifier_labels[k],
                **({"reference_knowledge_label": cap.reference_labels[k]}
                   if cap.reference_states is not None else {}),
            }) + "\n")


def _print_summary(config: ProbeConfig, out: Path, summary: dict, cap: _Captured) -> None:
    answers = summary["knowledge_answers"]
    print(f"fae probe: {summary['n_claims']} claims, {cap.n_unique} unique prompts, layer {config.layer}, "
          f"h(K) from the {config.knowledge_reference} -> {out}")
    print(f"  claim-only answers of the verifier: {shares_text(answers['verifier'])}")
    if cap.reference_states is not None:
        print(f"  claim-only answers of the base (h(K)): {shares_text(answers['reference'])}")
    if summary["reference_note"]:
        print(f"  warning: {summary['reference_note']}")
    for r in summary["rounds"]:
        print(f"  round {r['round']}: DirK {_fmt(r['mean'])} "
              f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]  n={r['n']} "
              f"undefined={r['n_undefined']}")
