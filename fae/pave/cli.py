"""`fae pave`: PAVE prior-state diagnostics and JSD arbitration for a verifier (SPEC §9).

Per SUPPORT/REFUTE claim: N sampled claim-only answers (knowledge prompt) ->
knowledge-boundary state (KK/KU/UK/UU), claims with an abstaining prior
filtered out (the paper's refusal filtering; ``--keep-refusals`` keeps them);
N sampled answers with the gold
evidence sentences -> correction rate CR on prior-wrong claims; where the
record carries ``counterfactual_sentences`` (misleading evidence), N sampled
answers with them -> persistence rate PR on prior-right claims; Margin and
odds of influence per state (Margin = the paper's Known + Unknown margins).
Then the JSD arbitration rule on K further runs per prompt (the paper's K = 5
at temperature 1.0), τ tuned on a held-out split of the claims, reporting CE,
IE and OA on the rest; the vote-based variant (App. C.2) where per-run
distributions are missing or identical by construction. ``--check-run RUN_DIR``
puts PAVE's gold-evidence accuracy beside that run's round-0 accuracy.

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
import dataclasses
import json
from pathlib import Path

from real_fae_core.atomicio import atomic_write_json, atomic_write_text
from real_fae_core.config import add_option_flags
from real_fae_core.errors import RunFailure, UserError
from real_fae_core.flags import deprecated_alias
from real_fae_core.hashing import sha256_file
from real_fae_core.labels import REFUTE, SUPPORT
from real_fae_core.runlock import RunLock
from real_fae_core.secrets import scrub
from data_prep.records import RecordError, load_records
from fae.ablation.runio import adapter_sha256, load_run
from fae.backends import BackendError, BackendOptions
from fae.backends.hf import HFOptions
from fae.backends.openai_backend import OpenAIOptions
from fae.backends.vllm_backend import VLLMOptions
from fae.pave.analysis import FAE_GAP_POINTS, analyse, fae_round0_check
from fae.pave.io import SAMPLES, collect, jsd_condition
from fae.pave.prompts import counterfactual_records
from fae.pave.report import render_markdown, summary_lines
from fae.pave.sampling import make_sampler


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", required=True, help="claim records (.jsonl); optional field "
                   "counterfactual_sentences: [{\"id\", \"text\"}, ...] = misleading evidence, or one such "
                   "list per kind {\"entity\": [...], \"semantic\": [...]} (real-data counterfactual)")
    p.add_argument("--output", required=True, help="output directory (resumed if present)")
    p.add_argument("--backend", default="hf", choices=["hf", "openai", "vllm"],
                   help="hf (default), openai or vllm (N answers per prompt as one request with n = N)")
    p.add_argument("--model", required=True, help="model path (hf) or served model name (openai)")
    p.add_argument("--adapter", help="PEFT LoRA adapter directory (hf)")
    p.add_argument("--samples", type=int, default=10,
                   help="sampled answers per prompt for states, CR and PR, N (default 10, the paper's)")
    p.add_argument("--temperature", type=float, default=0.3,
                   help="their sampling temperature, > 0 (default 0.3, the paper's)")
    p.add_argument("--jsd-samples", type=int, default=5,
                   help="sampled answers per prompt for the JSD rule, K (default 5, the paper's)")
    p.add_argument("--jsd-temperature", type=float, default=1.0,
                   help="their sampling temperature, > 0 (default 1.0, the paper's); with the same K and "
                        "temperature as the profile the rule reuses the profile's answers")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--stability", choices=["auto", "jsd", "vote"], default="auto",
                   help="JSD over per-run label probabilities, or the paper's vote-based variant (binary "
                        "entropy of the SUPPORT share); auto = JSD when every run has its own distribution, "
                        "vote when some are missing or all runs of every prompt share one")
    p.add_argument("--tune-split", type=float, default=0.3, metavar="FRACTION",
                   help="share of claims held out to tune τ (hash of id and --seed); the rest is the "
                        "test split for CE/IE/OA (default 0.3)")
    p.add_argument("--keep-refusals", action="store_true",
                   help="turn the paper's refusal filtering off: keep claims whose claim-only majority is "
                        "NOT_ENOUGH_INFO or invalid (they count as wrong priors)")
    p.add_argument("--definite-prior-only", action="store_true",
                   help="refusal filtering, now the default (kept so older commands run)")
    p.add_argument("--check-run", metavar="RUN_DIR",
                   help="a finished `fae run` of the same verifier on these records: report PAVE's "
                        "gold-evidence accuracy beside its round-0 accuracy and flag a gap > 10 points")
    deprecated_alias(p, "--fae-run", "--check-run")
    p.add_argument("--seed", type=int, default=0,
                   help="sampling and split seed; each prompt's answers are seeded by (seed, claim id, condition)")
    p.add_argument("--limit", type=int, help="only the first N SUPPORT/REFUTE records")
    p.add_argument("--chunk-size", type=int, default=32,
                   help="claims per write to samples.jsonl (answers do not depend on it)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    # The backends' own options, declared from their dataclasses (as `fae run` has them); PAVE's --seed
    # seeds each prompt's samples itself, and it reads no label probabilities from the FAE backends.
    add_option_flags(p, BackendOptions, ["constrained_decoding"])
    g = p.add_argument_group("hf backend")
    g.add_argument("--batch-size", type=int, default=8,
                   help="accepted for symmetry with `fae run`; answers never depend on it: each prompt's N "
                        "answers are one generate call, seeded by the prompt's key")
    add_option_flags(g, HFOptions, HF_FIELDS)
    add_option_flags(p.add_argument_group("vllm backend (and --dtype)"), VLLMOptions, VLLM_FIELDS)
    add_option_flags(p.add_argument_group("openai backend"), OpenAIOptions, OPENAI_FIELDS)


HF_FIELDS = ("device", "dtype", "trust_remote_code")
VLLM_FIELDS = ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len")
OPENAI_FIELDS = ("base_url", "api_key_env", "concurrency", "request_timeout", "max_retries", "backoff_base")
OWNERS = {"hf": HF_FIELDS, "vllm": VLLM_FIELDS + ("dtype",), "openai": OPENAI_FIELDS}


def check_backend_options(args) -> None:
    """An option of another backend, set away from its default, would be ignored: one line naming it."""
    own = set(OWNERS[args.backend])
    for backend, names in OWNERS.items():
        cls = {"hf": HFOptions, "vllm": VLLMOptions, "openai": OpenAIOptions}[backend]
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for name in names:
            if name not in own and getattr(args, name) != defaults[name]:
                raise UserError(f"--{name.replace('_', '-')} is an option of --backend {backend}; --backend "
                                f"{args.backend} does not read it (remove it, or choose that backend)")


def run(args) -> int:
    check_backend_options(args)
    if args.temperature <= 0 or args.jsd_temperature <= 0:
        raise UserError("--temperature and --jsd-temperature must be > 0: PAVE needs sampled answers")
    if args.samples < 2 or args.jsd_samples < 2:
        raise UserError("--samples and --jsd-samples must be at least 2")
    if args.keep_refusals and args.definite_prior_only:
        raise UserError("--keep-refusals and --definite-prior-only contradict each other; give one")
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
    fae_run = None
    if args.check_run:
        fae_run = load_run(args.check_run)  # refuses an unfinished or inconsistent run, one line

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; give a directory")
    with RunLock(out, "fae pave", is_dir=True):  # one writer for the command's lifetime
        return _pave(args, records, out, fae_run)


# Compared on resume: a difference means the stored answers are not this command's answers.
# "sampling" names the seeding scheme (answers seeded per prompt by (seed, claim id, condition)).
SAMPLING_SCHEME = "per-prompt-seed-1"
# Contents, not only paths (as `fae run`): a records file or adapter rewritten in place (a retrained adapter
# at the same path, counterfactuals rebuilt into the records) is another run, never mixed with the old samples.
FINGERPRINT = ("records", "records_sha256", "backend", "model", "adapter", "adapter_sha256", "samples",
               "temperature", "jsd_samples", "jsd_temperature", "max_new_tokens", "seed", "sampling", "dtype")


def _pave(args, records: list, out: Path, fae_run=None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"records": str(args.records), "records_sha256": sha256_file(args.records), "backend": args.backend,
           "model": args.model, "adapter": args.adapter, "adapter_sha256": adapter_sha256(args.adapter),
           "samples": args.samples, "temperature": args.temperature, "jsd_samples": args.jsd_samples,
           "jsd_temperature": args.jsd_temperature, "max_new_tokens": args.max_new_tokens,
           "seed": args.seed, "sampling": SAMPLING_SCHEME, "base_url": args.base_url,
           "tune_split": args.tune_split, "stability": args.stability,
           "constrained_decoding": bool(getattr(args, "constrained_decoding", False))}
    if args.backend == "vllm":  # vLLM's dtype changes the samples (bf16 by default)
        cfg["dtype"] = "bfloat16" if args.dtype == "auto" else args.dtype
    cfg_path = out / "config.json"
    if cfg_path.is_file() and (out / SAMPLES).is_file():
        old = json.loads(cfg_path.read_text())
        diff = [k if k in old else f"{k} (not recorded there)" for k in FINGERPRINT if old.get(k) != cfg.get(k)]
        if bool(old.get("constrained_decoding")) != cfg["constrained_decoding"]:
            diff.append("constrained_decoding")
        if diff:
            raise UserError(f"{out} holds samples made with different settings or inputs ({', '.join(diff)}); "
                            "use another --output")
    atomic_write_json(cfg_path, cfg)
    for derived in ("pave.json", "pave.md"):  # a stopped run never leaves an earlier run's numbers behind
        (out / derived).unlink(missing_ok=True)
    sampler = make_sampler(args.backend, vars(args), args.stability)
    try:
        lines = collect(records, sampler, args, out)
    except BackendError as exc:  # its text is scrubbed of the key by the backend
        raise RunFailure(f"{scrub(exc)}. Finished claims are saved in {out / SAMPLES}; "
                         "rerun the same command to resume") from None
    finally:
        sampler.close()
    res = analyse(lines, tune_fraction=args.tune_split, seed=args.seed, mode=args.stability,
                  refusals=not args.keep_refusals, jsd_condition=lambda cond: jsd_condition(cond, args),
                  jsd_settings={"runs": args.jsd_samples, "temperature": args.jsd_temperature})
    if fae_run is not None:
        _fae_check(res, lines, fae_run, args)
    res["config"] = cfg
    atomic_write_json(out / "pave.json", res)
    atomic_write_text(out / "pave.md", render_markdown(res, cfg))
    for line in summary_lines(res):
        print(line)
    print(f"wrote {out / 'pave.json'} and {out / 'pave.md'}")
    return 0


def _fae_check(res: dict, lines: list[dict], fae_run, args) -> None:
    """--check-run: the gold-evidence vs round-0 comparison, and a note when the run is of another verifier."""
    chk = res["fae_check"] = fae_round0_check(lines, fae_run.claims, fae_run=str(args.check_run),
                                              temperature=args.temperature)
    same = (fae_run.config.get("model") == args.model
            and fae_run.config.get("adapter_sha256") == adapter_sha256(args.adapter))
    chk["same_verifier"] = same
    if not same:
        res["notes"].append(f"--check-run {args.check_run} was made with model {fae_run.config.get('model')!r} and "
                            "another adapter or model than this PAVE run: the comparison is between two verifiers")
    if chk["disagree"]:
        res["notes"].append("PAVE's gold-evidence accuracy and FAE's round-0 accuracy differ by more than "
                            f"{FAE_GAP_POINTS:.0f} points: {chk['explanation']}")
