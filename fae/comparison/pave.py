"""`fae pave`: PAVE prior-state diagnostics and JSD arbitration for a verifier (SPEC §9).

Per SUPPORT/REFUTE claim: N sampled claim-only answers (knowledge prompt) ->
knowledge-boundary state (KK/KU/UK/UU); N sampled answers with the gold
evidence sentences -> correction rate CR on prior-wrong claims; where the
record carries ``counterfactual_sentences`` (misleading evidence), N sampled
answers with them -> persistence rate PR on prior-right claims; Margin and
odds of influence per state. Then the JSD arbitration rule with τ tuned on a
held-out split of the claims, reporting CE, IE and OA on the rest.

``counterfactual_sentences`` is either one pool (a list shaped like
``sentences``: one kind, "counterfactual") or one pool per kind, as written
by ``real-data counterfactual``: ``{"entity": [...], "semantic": [...]}``.
PR, Margin, odds of influence and the JSD rule are reported per kind (the
seed paper's counter-entity / counter-semantic columns); the top-level
``profile``/``arbitration`` of pave.json are those of the first kind.

Answers are written to ``OUTPUT/samples.jsonl`` chunk by chunk; rerunning
the same command resumes. ``pave.json`` and ``pave.md`` hold the results.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import numpy as np

from data_prep.core.errors import RunFailure, UserError
from data_prep.core.jsonl import read_appended
from data_prep.core.labels import REFUTE, SUPPORT
from data_prep.core.secrets import scrub
from data_prep.prompts import (
    parse_answer,
    render_evidence_prompt,
    render_knowledge_prompt,
)
from data_prep.records import ClaimRecord, RecordError, Sentence, load_records
from fae.backends import BackendError
from fae.comparison import pave_metrics as pm

CONDITIONS = ("claim_only", "gold_evidence", "counterfactual")  # + "counterfactual_<kind>" per kind
LEGACY_KIND = "counterfactual"  # the kind of a plain list of counterfactual sentences
KIND_ORDER = ("entity", "semantic")
_KIND_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
SAMPLES = "samples.jsonl"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", required=True, help="claim records (.jsonl); optional field "
                   "counterfactual_sentences: [{\"id\", \"text\"}, ...] = misleading evidence, or one such "
                   "list per kind {\"entity\": [...], \"semantic\": [...]} (real-data counterfactual)")
    p.add_argument("--output", required=True, help="output directory (resumed if present)")
    p.add_argument("--backend", default="hf", choices=["hf", "openai"], help="hf (default) or openai")
    p.add_argument("--model", required=True, help="model path (hf) or served model name (openai)")
    p.add_argument("--adapter", help="PEFT LoRA adapter directory (hf)")
    p.add_argument("--samples", type=int, default=10, help="sampled answers per prompt, N = K (default 10)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature, > 0 (default 0.7)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--stability", choices=["auto", "jsd", "vote"], default="auto",
                   help="JSD over per-run label probabilities, or the vote-entropy variant; auto = JSD "
                        "when every run has probabilities, else vote")
    p.add_argument("--tune-split", type=float, default=0.3, metavar="FRACTION",
                   help="share of claims held out to tune τ (hash of id and --seed); the rest is the "
                        "test split for CE/IE/OA (default 0.3)")
    p.add_argument("--definite-prior-only", action="store_true",
                   help="drop claims whose claim-only majority is NEI or invalid (the paper's refusal filter)")
    p.add_argument("--seed", type=int, default=0, help="sampling and split seed")
    p.add_argument("--limit", type=int, help="only the first N SUPPORT/REFUTE records")
    p.add_argument("--chunk-size", type=int, default=32, help="claims per write to samples.jsonl")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--constrained-decoding", action="store_true",
                   help="hold every sampled answer to its prompt's JSON schema (docs/structured.md)")
    g = p.add_argument_group("hf backend")
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--device", default="auto")
    g.add_argument("--dtype", default="auto")
    g = p.add_argument_group("openai backend")
    g.add_argument("--base-url")
    g.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    g.add_argument("--concurrency", type=int, default=8)
    g.add_argument("--request-timeout", type=float, default=60.0)
    g.add_argument("--max-retries", type=int, default=6)


# ---------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------


def condition_name(kind: str) -> str:
    """samples.jsonl condition of a kind ("counterfactual" for the single-list form)."""
    return "counterfactual" if kind == LEGACY_KIND else f"counterfactual_{kind}"


def kind_sort_key(kind: str) -> tuple:
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind)


def _pool_record(rec: ClaimRecord, raw, field: str) -> ClaimRecord:
    if not isinstance(raw, list) or not raw:
        raise RecordError("must be a non-empty list of sentences", field=field, record_id=rec.id)
    sents = []
    for k, s in enumerate(raw):
        if not isinstance(s, dict) or not isinstance(s.get("text"), str):
            raise RecordError(f"item {k} needs a 'text' string", field=field, record_id=rec.id)
        sid = s.get("id", k)
        if not isinstance(sid, int) or isinstance(sid, bool):
            raise RecordError(f"item {k} id must be an integer", field=field, record_id=rec.id)
        sents.append(Sentence(id=sid, text=s["text"], doc=s.get("doc")))
    if len({s.id for s in sents}) != len(sents):
        raise RecordError("duplicate sentence ids", field=field, record_id=rec.id)
    return ClaimRecord(id=rec.id, claim=rec.claim, label=rec.label, sentences=sents, evidence=[])


def counterfactual_records(rec: ClaimRecord) -> dict[str, ClaimRecord]:
    """Kind -> the record with its pool replaced by that kind's counterfactual sentences ({} when absent)."""
    raw = rec.extra.get("counterfactual_sentences")
    if raw is None:
        return {}
    if isinstance(raw, list):
        return {LEGACY_KIND: _pool_record(rec, raw, "counterfactual_sentences")}
    if not isinstance(raw, dict) or not raw:
        raise RecordError("must be a non-empty list of sentences or an object {kind: [sentences]}",
                          field="counterfactual_sentences", record_id=rec.id)
    out = {}
    for kind in sorted(raw, key=kind_sort_key):
        if not _KIND_NAME.match(kind) or kind == LEGACY_KIND:
            raise RecordError(f"kind {kind!r} must be a lower-case name such as 'entity' or 'semantic'",
                              field="counterfactual_sentences", record_id=rec.id)
        out[kind] = _pool_record(rec, raw[kind], f"counterfactual_sentences.{kind}")
    return out


def counterfactual_record(rec: ClaimRecord) -> ClaimRecord | None:
    """The first kind's counterfactual record (None when absent); kept for callers of the one-pool API."""
    return next(iter(counterfactual_records(rec).values()), None)


def prompts_for(rec: ClaimRecord) -> dict[str, tuple[list, list[int]]]:
    """Condition -> (chat messages, pool ids shown). Gold evidence = the union of the gold groups."""
    out = {
        "claim_only": (render_knowledge_prompt(rec), []),
        "gold_evidence": (render_evidence_prompt(rec, rec.gold_ids), rec.gold_ids),
    }
    for kind, cf in counterfactual_records(rec).items():
        out[condition_name(kind)] = (render_evidence_prompt(cf), cf.pool_ids)
    return out


# ---------------------------------------------------------------------------
# Sampling (resumable)
# ---------------------------------------------------------------------------


def read_samples(path: Path) -> dict[str, dict]:
    """Finished claims of samples.jsonl by id; a line cut by a kill is dropped and cut from the file."""
    done = {}
    for line_no, obj in read_appended(path, repair=True):  # the caller holds the output's RunLock
        if isinstance(obj, RecordError):
            raise obj.located(path, line_no)
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), str) \
                or not isinstance(obj.get("conditions"), dict):
            raise UserError(f"{path}:{line_no}: not a samples line (needs 'id' and 'conditions'); "
                            "use another --output")
        done[obj["id"]] = obj
    return done


def collect(records: list[ClaimRecord], sampler, args, out_dir: Path) -> list[dict]:
    """Sample every condition of every claim, appending finished claims to samples.jsonl."""
    from tqdm.auto import tqdm

    path = out_dir / SAMPLES
    done = read_samples(path)
    # A claim whose record gained a counterfactual kind since it was sampled is sampled again.
    todo = [r for r in records if r.id not in done or not set(prompts_for(r)) <= set(done[r.id]["conditions"])]
    bar = tqdm(total=len(records), initial=len(records) - len(todo), desc="pave", unit="claim",
               disable=not args.progress)
    with path.open("a") as fh:
        for start in range(0, len(todo), args.chunk_size):
            chunk = todo[start:start + args.chunk_size]
            jobs = [(rec, cond, msgs, pool) for rec in chunk for cond, (msgs, pool) in prompts_for(rec).items()]
            results = sampler.sample([j[2] for j in jobs], args.samples)
            lines: dict[str, dict] = {}
            for (rec, cond, _msgs, pool), samples in zip(jobs, results):
                line = lines.setdefault(rec.id, {"id": rec.id, "gold_label": rec.label, "conditions": {}})
                parsed = [parse_answer(text, pool) for text, _ in samples]
                line["conditions"][cond] = {
                    "answers": [p.label if p.valid else None for p in parsed],
                    "probs": [probs for _, probs in samples],
                    "raw": [text for text, _ in samples],
                }
            for rec in chunk:
                fh.write(json.dumps(lines[rec.id]) + "\n")
                done[rec.id] = lines[rec.id]
            fh.flush()
            bar.update(len(chunk))
    bar.close()
    return [done[r.id] for r in records]


# ---------------------------------------------------------------------------
# Analysis (pure given the sampled lines)
# ---------------------------------------------------------------------------


def stability(cond: dict, mode: str) -> tuple[float, str]:
    """JSD of the runs' label distributions, or vote entropy; returns (value, variant used)."""
    probs = cond.get("probs") or []
    have = bool(probs) and all(p is not None for p in probs)
    if mode == "jsd" and not have:
        raise UserError("--stability jsd needs label probabilities for every run; this backend/endpoint "
                        "returned none (use --stability vote or auto)")
    if mode != "vote" and have:
        return pm.jsd(np.array(probs, float)), "jsd"
    return pm.vote_entropy(cond["answers"]), "vote"


def line_kinds(lines: list[dict]) -> list[str]:
    """Counterfactual kinds present in the sampled lines, in report order."""
    kinds = set()
    for ln in lines:
        for cond in ln["conditions"]:
            if cond == "counterfactual":
                kinds.add(LEGACY_KIND)
            elif cond.startswith("counterfactual_"):
                kinds.add(cond[len("counterfactual_"):])
    return sorted(kinds, key=kind_sort_key)


def analyse(lines: list[dict], *, tune_fraction: float, seed: int, mode: str, definite_only: bool) -> dict:
    notes = []
    if definite_only:
        kept = [ln for ln in lines if pm.prior_is_definite(ln["conditions"]["claim_only"]["answers"])]
        notes.append(f"--definite-prior-only dropped {len(lines) - len(kept)} claims whose claim-only majority "
                     "was NOT_ENOUGH_INFO or invalid")
        lines = kept
    if not lines:
        raise UserError("no claims left to analyse")
    kinds = line_kinds(lines)
    per_kind = {}
    for kind in kinds or [None]:
        kind_notes: list[str] = []
        profile, arbitration = _analyse_kind(lines, kind, tune_fraction=tune_fraction, seed=seed, mode=mode,
                                             notes=kind_notes)
        per_kind[kind] = {"profile": profile, "arbitration": arbitration}
        prefix = f"{kind}: " if kind is not None and len(kinds) > 1 else ""
        notes += [prefix + n for n in kind_notes if prefix + n not in notes]
    first = per_kind[kinds[0] if kinds else None]
    return pm.json_safe({
        "n_claims": len(lines),
        "profile": first["profile"],
        "arbitration": first["arbitration"],
        "primary_kind": kinds[0] if kinds else None,
        "kinds": {k: v for k, v in per_kind.items() if k is not None},
        "notes": notes,
    })


def _analyse_kind(lines: list[dict], kind: str | None, *, tune_fraction: float, seed: int, mode: str,
                  notes: list[str]) -> tuple[dict, dict]:
    """Arbitration profile and JSD rule with one kind of counterfactual evidence (None: none)."""
    gold = [ln["gold_label"] for ln in lines]
    co = [ln["conditions"]["claim_only"] for ln in lines]
    ge = [ln["conditions"]["gold_evidence"] for ln in lines]
    cond_name = condition_name(kind) if kind is not None else None
    cf = [ln["conditions"].get(cond_name) if cond_name else None for ln in lines]
    has_cf = [c is not None for c in cf]
    states = [pm.knowledge_state(c["answers"], g) for c, g in zip(co, gold)]
    profile = pm.arbitration_profile(
        states,
        [pm.correctness_rate(c["answers"], g) for c, g in zip(ge, gold)],
        [pm.correctness_rate(c["answers"], g) if c is not None else None for c, g in zip(cf, gold)],
    )
    profile["n_with_counterfactual"] = int(sum(has_cf))

    # JSD arbitration: claims with counterfactual evidence get CE and IE; others CE only.
    variants = set()

    def stab(c):
        v, variant = stability(c, mode)
        variants.add(variant)
        return v

    s_co = np.array([stab(c) for c in co])
    d_ce = s_co - np.array([stab(c) for c in ge])
    d_ie = np.array([s - stab(c) if c is not None else np.nan for s, c in zip(s_co, cf)])
    maj = lambda c: pm.majority_label(c["answers"])  # noqa: E731
    a_co = [maj(c) for c in co]
    a_ce = [maj(c) for c in ge]
    a_ie = [maj(c) if c is not None else None for c in cf]
    tune = pm.split_tune([ln["id"] for ln in lines], tune_fraction, seed)
    test = ~tune
    if tune.sum() == 0 or test.sum() == 0:
        notes.append("the tuning or the test split is empty (too few claims for --tune-split); "
                     "τ is tuned and evaluated on all claims")
        tune = test = np.ones(len(lines), bool)

    def part(mask, with_ie):
        idx = np.flatnonzero(mask & (np.array(has_cf) if with_ie else True))
        g = [gold[i] for i in idx]
        args = (g, [a_co[i] for i in idx], d_ce[idx], [a_ce[i] for i in idx])
        if with_ie:
            args += (d_ie[idx], [a_ie[i] for i in idx])
        return idx, args

    use_ie = bool(np.any(np.array(has_cf) & tune)) and bool(np.any(np.array(has_cf) & test))
    _, tune_args = part(tune, use_ie)
    tau, objective = pm.tune_tau(*tune_args)
    test_idx, test_args = part(test, use_ie)
    result = pm.ce_ie_oa(tau, *test_args)
    baselines = {
        "claim_only": pm.ce_ie_oa(math.inf, *test_args),  # τ = +inf: never take the evidence answer
        "evidence_only": pm.ce_ie_oa(-math.inf, *test_args),  # τ = -inf: always take it
    }
    if not use_ie:
        notes.append("no counterfactual_sentences on both splits: τ maximises CE only; IE and OA are undefined")
    all_d = np.concatenate([d_ce, d_ie[~np.isnan(d_ie)]])
    if "jsd" in variants and np.allclose(s_co, 0) and np.allclose(all_d, 0):
        notes.append("every run of a prompt had the same label distribution (JSD = 0 everywhere): with a "
                     "label-first answer format per-run probabilities do not vary; use --stability vote")
    arbitration = {
        "stability": sorted(variants),
        "tau": tau,
        "tune_objective": objective,
        "n_tune": int(tune.sum()),
        "n_test": int(len(test_idx)),
        "rule": "answer with the evidence-run majority when JSD(claim only) - JSD(with evidence) > tau",
        **result,
        "baselines": baselines,
    }
    return profile, arbitration


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _p(x) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


KIND_TITLES = {"entity": "counter-entity", "semantic": "counter-semantic"}


def render_markdown(res: dict, cfg: dict) -> str:
    pr = res["profile"]
    kinds = {k: v for k, v in (res.get("kinds") or {}).items() if k != LEGACY_KIND}
    lines = [
        "# PAVE diagnostics",
        "",
        f"- model `{cfg['model']}`" + (f", adapter `{cfg['adapter']}`" if cfg.get("adapter") else "")
        + f" ({cfg['backend']}); {cfg['samples']} samples per prompt at temperature {cfg['temperature']}",
    ]
    if not kinds:
        lines.append(f"- {res['n_claims']} claims, {pr['n_with_counterfactual']} with counterfactual evidence")
        lines += _kind_sections(pr, res["arbitration"], "")
    else:
        lines.append(f"- {res['n_claims']} claims; with counterfactual evidence: "
                     + ", ".join(f"{k} {v['profile']['n_with_counterfactual']}" for k, v in kinds.items()))
        lines += [
            "",
            "## By kind of counterfactual evidence",
            "",
            "| Kind | Claims | PR | CR | Margin | OI (KK) | OI (UK) | τ | IE | CE | OA |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for k, v in kinds.items():
            p, a = v["profile"], v["arbitration"]
            lines.append(f"| {KIND_TITLES.get(k, k)} | {p['n_with_counterfactual']} | {_p(p['PR'])} | {_p(p['CR'])} "
                         f"| {_f(p['Margin'])} | {_f(p['states']['KK']['OI'])} | {_f(p['states']['UK']['OI'])} "
                         f"| {_f(a['tau'])} | {_p(a['IE'])} | {_p(a['CE'])} | {_p(a['OA'])} |")
        for k, v in kinds.items():
            lines += _kind_sections(v["profile"], v["arbitration"], f": {KIND_TITLES.get(k, k)}")
    if res["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def _kind_sections(pr: dict, arb: dict, suffix: str) -> list[str]:
    st = pr["states"]
    lines = [
        "",
        f"## Arbitration profile{suffix}",
        "",
        "| State | Ratio | Rate | OI | Δ |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in pm.STATES:
        r = st[s]
        if s[1] == "K":
            lines.append(f"| {r['name']} (persistence) | {_p(r['ratio'])} | PR {_p(r['PR'])} | {_f(r['OI'])} "
                         f"| correct drop {_p(r['correct_drop'])} |")
        else:
            lines.append(f"| {r['name']} (correction) | {_p(r['ratio'])} | CR {_p(r['CR'])} | {_f(r['OI'])} "
                         f"| wrong reduction {_p(r['wrong_reduction'])} |")
    lines += [
        "",
        f"CR {_p(pr['CR'])}, PR {_p(pr['PR'])}, **Margin {_f(pr['Margin'])}** "
        f"(Known {_f(pr['margin_known'])}, Unknown {_f(pr['margin_unknown'])}, sum {_f(pr['margin_sum'])}). "
        f"Correct rate {_p(pr['correct_rate_prior'])} → {_p(pr['correct_rate_after'])} under counterfactual "
        f"evidence; wrong rate {_p(pr['wrong_rate_prior'])} → {_p(pr['wrong_rate_after'])} with gold evidence.",
        "",
        f"## JSD arbitration{suffix}",
        "",
        f"Stability: {', '.join(arb['stability'])}; τ = {_f(arb['tau'])} tuned on {arb['n_tune']} claims, "
        f"evaluated on {arb['n_test']}.",
        "",
        "| Method | IE | CE | OA |",
        "| --- | --- | --- | --- |",
        f"| JSD arbitration | {_p(arb['IE'])} | {_p(arb['CE'])} | {_p(arb['OA'])} |",
        f"| claim only | {_p(arb['baselines']['claim_only']['IE'])} | {_p(arb['baselines']['claim_only']['CE'])} "
        f"| {_p(arb['baselines']['claim_only']['OA'])} |",
        f"| evidence only | {_p(arb['baselines']['evidence_only']['IE'])} "
        f"| {_p(arb['baselines']['evidence_only']['CE'])} | {_p(arb['baselines']['evidence_only']['OA'])} |",
    ]
    return lines


# ---------------------------------------------------------------------------


def summary_lines(res: dict) -> list[str]:
    """One printed line per kind of counterfactual evidence (one line when there is a single pool or none)."""
    rows = [(k, v["profile"], v["arbitration"]) for k, v in (res.get("kinds") or {}).items() if k != LEGACY_KIND]
    if not rows:
        rows = [(None, res["profile"], res["arbitration"])]
    return [(f"{k:<9}" if k else "") + f"Margin {_f(pr['Margin'])}  CR {_p(pr['CR'])}  PR {_p(pr['PR'])}  |  "
            f"JSD rule τ={_f(arb['tau'])}: CE {_p(arb['CE'])} IE {_p(arb['IE'])} OA {_p(arb['OA'])}"
            for k, pr, arb in rows]


def run(args) -> int:
    if args.temperature <= 0:
        raise UserError("--temperature must be > 0: PAVE needs sampled answers")
    if args.samples < 2:
        raise UserError("--samples must be at least 2")
    if not 0 < args.tune_split < 1:
        raise UserError("--tune-split must be a fraction in (0, 1)")
    try:
        records = load_records(args.records)
        records = [r for r in records if r.label in (SUPPORT, REFUTE)]
        if args.limit:
            records = records[: args.limit]
        for r in records:
            counterfactual_records(r)
    except RecordError as exc:
        raise UserError(str(exc.located(args.records, None) if exc.path is None else exc)) from None
    if not records:
        raise UserError(f"{args.records}: no SUPPORT/REFUTE records")
    from data_prep.core.runlock import RunLock

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; give a directory")
    with RunLock(out, "fae pave", is_dir=True):  # one writer for the command's lifetime
        return _pave(args, records, out)


def _pave(args, records: list, out: Path) -> int:
    from fae.comparison.pave_sampling import make_sampler

    out.mkdir(parents=True, exist_ok=True)
    cfg = {"records": str(args.records), "backend": args.backend, "model": args.model, "adapter": args.adapter,
           "samples": args.samples, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
           "seed": args.seed, "base_url": args.base_url,
           "constrained_decoding": bool(getattr(args, "constrained_decoding", False))}
    cfg_path = out / "config.json"
    if cfg_path.is_file() and (out / SAMPLES).is_file():
        old = json.loads(cfg_path.read_text())
        diff = [k for k in ("records", "backend", "model", "adapter", "samples", "temperature") if old.get(k) != cfg[k]]
        if bool(old.get("constrained_decoding")) != cfg["constrained_decoding"]:
            diff.append("constrained_decoding")
        if diff:
            raise UserError(f"{out} holds samples made with different settings ({', '.join(diff)}); "
                            "use another --output")
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    options = dict(vars(args))
    options.pop("_run_parser", None)
    sampler = make_sampler(args.backend, options)
    try:
        lines = collect(records, sampler, args, out)
    except BackendError as exc:  # its text is scrubbed of the key by the backend
        raise RunFailure(f"{scrub(exc)}. Finished claims are saved in {out / SAMPLES}; "
                         "rerun the same command to resume") from None
    finally:
        sampler.close()
    res = analyse(lines, tune_fraction=args.tune_split, seed=args.seed, mode=args.stability,
                  definite_only=args.definite_prior_only)
    res["config"] = cfg
    (out / "pave.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "pave.md").write_text(render_markdown(res, cfg))
    for line in summary_lines(res):
        print(line)
    print(f"wrote {out / 'pave.json'} and {out / 'pave.md'}")
    return 0
