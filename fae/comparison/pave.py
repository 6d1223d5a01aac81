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

This module is the command (options, checks, the run); the jobs live beside
it: ``pave_prompts`` (conditions and prompts), ``pave_sampling`` (backends),
``pave_io`` (samples.jsonl), ``pave_analysis`` + ``pave_metrics`` (numbers),
``pave_report`` (pave.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_prep.core.errors import RunFailure, UserError
from data_prep.core.labels import REFUTE, SUPPORT
from data_prep.core.secrets import scrub
from data_prep.records import RecordError, load_records
from fae.backends import BackendError
from fae.comparison.pave_analysis import analyse
from fae.comparison.pave_io import SAMPLES, collect
from fae.comparison.pave_prompts import counterfactual_records
from fae.comparison.pave_report import render_markdown, summary_lines


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
