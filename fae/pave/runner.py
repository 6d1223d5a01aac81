"""`fae pave` as a library: PAVE prior-state diagnostics and JSD arbitration for a verifier (SPEC §9).

:func:`run` takes a :class:`PaveConfig` (the command's config: the dispatcher generates its parser); the
command, `fae study`, the demo and Python callers call it.

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

This module is the run (options, checks, the run); the jobs live beside
it in :mod:`fae.pave`: ``prompts`` (conditions and prompts), ``sampling``
(backends), ``io`` (samples.jsonl), ``analysis`` + ``metrics`` (numbers),
``report`` (pave.md).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from real_fae_core.atomicio import atomic_write_json, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, field_names, option
from real_fae_core.errors import RunFailure, UserError
from real_fae_core.fingerprint import RunFingerprint
from real_fae_core.outputs import Output, any_of, claim_dir
from real_fae_core.hashing import sha256_file
from real_fae_core.labels import REFUTE, SUPPORT
from real_fae_core.runlock import RunLock
from real_fae_core.secrets import scrub
from data_prep.prompts import LINE_IDS, check_line_ids
from data_prep.records import RecordError, load_records
from fae.ablation.runio import adapter_sha256, load_run
from fae.backends import BackendError, BackendOptions
from fae.backends.hf import HF_GROUP, HFOptions
from fae.pave.analysis import FAE_GAP_POINTS, analyse, fae_round0_check
from fae.pave.io import SAMPLES, collect, jsd_condition
from fae.pave.prompts import counterfactual_records
from fae.pave.report import render_markdown, summary_lines
from fae.pave.sampling import make_sampler
from fae.backends.options import (HFLoadFields, OpenAIServingFields, ServingFields, VLLMServingFields, backend_field,
                                  sampling_dtype)

BACKENDS = ("hf", "openai", "vllm")
STABILITY = ("auto", "jsd", "vote")


@dataclasses.dataclass
class PaveFields:
    """`fae pave`'s own options; the backends' options it embeds follow in :class:`PaveConfig`."""

    records: str = option(help="claim records (.jsonl); optional field counterfactual_sentences: [{\"id\", "
                               "\"text\"}, ...] = misleading evidence, or one such list per kind {\"entity\": "
                               "[...], \"semantic\": [...]} (real-data counterfactual)")
    output: str = option(help="output directory (resumed if present)")
    model: str = option(help="model path (hf) or served model name (openai)")
    backend: str = option("hf", choices=BACKENDS,
                          help="hf (default), openai or vllm (N answers per prompt as one request with n = N)")
    adapter: str | None = backend_field(BackendOptions, "adapter", help="PEFT LoRA adapter directory (hf)")
    samples: int = option(10, min=2, help="sampled answers per prompt for states, CR and PR, N (default 10, the "
                                          "paper's)")
    temperature: float = option(  # > 0: checked by run, one line for both temperatures
        0.3, help="their sampling temperature, > 0 (default 0.3, the paper's)")
    jsd_samples: int = option(5, min=2, help="sampled answers per prompt for the JSD rule, K (default 5, the "
                                             "paper's)")
    jsd_temperature: float = option(1.0, help="their sampling temperature, > 0 (default 1.0, the paper's); with the "
                                              "same K and temperature as the profile the rule reuses the profile's "
                                              "answers")
    max_new_tokens: int = backend_field(BackendOptions, "max_new_tokens")
    stability: str = option("auto", choices=STABILITY,
                            help="JSD over per-run label probabilities, or the paper's vote-based variant (binary "
                                 "entropy of the SUPPORT share); auto = JSD when every run has its own distribution, "
                                 "vote when some are missing or all runs of every prompt share one")
    tune_split: float = option(0.3, above=0, below=1, metavar="FRACTION",
                               help="share of claims held out to tune τ (hash of id and --seed); the rest is the "
                                    "test split for CE/IE/OA (default 0.3)")
    keep_refusals: bool = option(False, help="turn the paper's refusal filtering off: keep claims whose claim-only "
                                             "majority is NOT_ENOUGH_INFO or invalid (they count as wrong priors)")
    definite_prior_only: bool = option(False, help="refusal filtering, now the default (kept so older commands run)")
    check_run: str | None = option(None, metavar="RUN_DIR", deprecated=("--fae-run",),
                                   help="a finished `fae run` of the same verifier on these records: report PAVE's "
                                        "gold-evidence accuracy beside its round-0 accuracy and flag a gap > 10 "
                                        "points")
    seed: int = option(0, help="sampling and split seed; each prompt's answers are seeded by (seed, claim id, "
                               "condition)")
    limit: int | None = option(None, min=1, help="only the first N SUPPORT/REFUTE records")
    chunk_size: int = option(32, min=1, help="claims per write to samples.jsonl (answers do not depend on it)")
    progress: bool = True  # --no-progress
    line_ids: str = option(  # how the prompts number their lines (SPEC §3, data_prep.prompts.LINE_IDS)
        "original", choices=LINE_IDS,
        help="line numbers shown (SPEC §3): original record ids (default, the paper's protocol; a gold-only pool "
             "then shows holes) or renumbered 0..n-1 in reading order, cited numbers mapped back")
    constrained_decoding: bool = backend_field(BackendOptions, "constrained_decoding",
                                               action=argparse.BooleanOptionalAction)


@dataclasses.dataclass
class PaveHFFields:
    """`fae pave`'s options of the hf backend beside its loading options (:class:`HFLoadFields`)."""

    batch_size: int = backend_field(  # PAVE samples one prompt at a time: only 8
        HFOptions, "batch_size",
        help="PAVE samples one prompt at a time (each prompt's N answers are one generate call seeded by the "
             "prompt's own key, so they never depend on other prompts): a value other than the default 8 is refused")
    prefill_once: bool = option(  # hf: one prefill for a prompt's N samples (fae.pave.sampling.one_row_prefill)
        False, group=HF_GROUP, help="run a prompt's prefill once for its N samples and copy the KV cache (about 1/N of the prompt's "
                    "work); its samples equal the default's only on CPUs and GPUs where a row of a batched matmul "
                    "equals that row alone (an AVX-512 CPU: yes; an AMX CPU: no), and one AMX CPU once gave other "
                    "samples from one process to the next (a resumed run may then differ from an uninterrupted one: "
                    "benchmarks/pave_reproducibility.py checks a machine); it is off unless asked, and a run made "
                    "with it never resumes one made without it")


@dataclasses.dataclass
class PaveConfig(ServingFields, HFLoadFields, PaveHFFields, PaveFields, CommandConfig):
    """`fae pave`: PAVE prior-state diagnostics and JSD arbitration of a verifier."""

    # PAVE's own options, then the backends' own as `fae run` has them, each backend's under its heading (their
    # fields' `group`); PAVE's --seed seeds each prompt's samples itself, and it reads no label probabilities
    # from the FAE backends
    COMMAND_FIELDS = field_names(PaveFields, PaveHFFields, HFLoadFields, VLLMServingFields, OpenAIServingFields)


HF_FIELDS = field_names(HFLoadFields)
VLLM_FIELDS = field_names(VLLMServingFields)
OPENAI_FIELDS = field_names(OpenAIServingFields)
ONE_PROMPT_AT_A_TIME = PaveConfig.batch_size  # the only --batch-size PAVE takes: its default
# the options each backend reads: its declared fields, and the hf sampler's own --prefill-once
OWNERS = {"hf": HF_FIELDS + ("prefill_once",), "vllm": VLLM_FIELDS + ("dtype",), "openai": OPENAI_FIELDS}


def check_backend_options(config: PaveConfig) -> None:
    """An option of another backend, set away from its default, would be ignored: one line naming it."""
    own = set(OWNERS[config.backend])
    defaults = {f.name: f.default for f in dataclasses.fields(PaveConfig)}  # declared from the backends' own
    for backend, names in OWNERS.items():
        for name in names:
            if name not in own and getattr(config, name) != defaults[name]:
                raise UserError(f"--{name.replace('_', '-')} is an option of --backend {backend}; --backend "
                                f"{config.backend} does not read it (remove it, or choose that backend)")


def check_choices(config: PaveConfig) -> None:
    """--backend, --stability and --batch-size as the parser offers them (a Python caller has no parser)."""
    if config.backend not in BACKENDS:
        raise UserError(f"fae pave supports --backend {', '.join(BACKENDS)}, not {config.backend!r}")
    if config.stability not in STABILITY:
        raise UserError(f"--stability must be one of {', '.join(STABILITY)}, got {config.stability!r}")
    check_line_ids(config.line_ids, error=UserError)
    if config.batch_size != ONE_PROMPT_AT_A_TIME:
        raise UserError(f"--batch-size {config.batch_size}: fae pave samples one prompt at a time (each prompt's "
                        f"answers are seeded by its own key), so it takes no batch size other than the default "
                        f"{ONE_PROMPT_AT_A_TIME}")


def run(config: PaveConfig) -> CommandResult:
    """`fae pave` as a function: samples.jsonl, pave.json and the report in ``config.output``, resumed where a
    kill left them; bad options, bad records or no SUPPORT/REFUTE record are one :class:`UserError`."""
    check_choices(config)
    check_backend_options(config)
    if config.temperature <= 0 or config.jsd_temperature <= 0:
        raise UserError("--temperature and --jsd-temperature must be > 0: PAVE needs sampled answers")
    if config.keep_refusals and config.definite_prior_only:
        raise UserError("--keep-refusals and --definite-prior-only contradict each other; give one")
    try:
        records = load_records(config.records)
        records = [r for r in records if r.label in (SUPPORT, REFUTE)]
        if config.limit:
            records = records[: config.limit]
        for r in records:
            counterfactual_records(r)
    except RecordError as exc:
        raise UserError(str(exc.located(config.records, None) if exc.path is None else exc)) from None
    if not records:
        raise UserError(f"{config.records}: no SUPPORT/REFUTE records")
    fae_run = None
    if config.check_run:
        fae_run = load_run(config.check_run)  # refuses an unfinished or inconsistent run, one line

    out = Path(config.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; give a directory")
    claim_dir(out, "fae pave", inputs=[config.records, config.check_run],
              legacy=any_of("config.json", "samples.jsonl", "pave.json"))
    with RunLock(out, "fae pave", is_dir=True):  # one writer for the command's lifetime
        return _pave(config, records, out, fae_run)


# Compared on resume: a difference means the stored answers are not this command's answers.
# "sampling" names the seeding scheme (answers seeded per prompt by (seed, claim id, condition)).
SAMPLING_SCHEME = "per-prompt-seed-1"
# Contents, not only paths (as `fae run`): a records file or adapter rewritten in place (a retrained adapter
# at the same path, counterfactuals rebuilt into the records) is another run, never mixed with the samples
# already in OUTPUT.
# The dtype the model ran in is recorded for hf (auto = bf16 on a CPU with native bf16, else fp32) and vllm.
FINGERPRINT = ("records", "records_sha256", "backend", "model", "adapter", "adapter_sha256", "samples",
               "temperature", "jsd_samples", "jsd_temperature", "max_new_tokens", "seed", "sampling", "dtype",
               "line_ids")
# Flags a stored config.json may lack (one written before them): absent means off, and a missing --line-ids means
# record ids (the compatibility defaults of `fae pave`, real_fae_core.fingerprint.COMPATIBILITY_DEFAULTS).
FINGERPRINT_FLAGS = ("constrained_decoding", "prefill_once")
PAVE_FINGERPRINT = RunFingerprint("fae pave", FINGERPRINT + FINGERPRINT_FLAGS)


def _pave(config: PaveConfig, records: list, out: Path, fae_run=None) -> CommandResult:
    Output(out, "fae pave").mark(files=())
    cfg = {"records": str(config.records), "records_sha256": sha256_file(config.records),
           "backend": config.backend, "model": config.model, "adapter": config.adapter,
           "adapter_sha256": adapter_sha256(config.adapter),
           "samples": config.samples, "temperature": config.temperature, "jsd_samples": config.jsd_samples,
           "jsd_temperature": config.jsd_temperature, "max_new_tokens": config.max_new_tokens,
           "seed": config.seed, "sampling": SAMPLING_SCHEME, "base_url": config.base_url,
           "tune_split": config.tune_split, "stability": config.stability,
           "constrained_decoding": config.constrained_decoding, "prefill_once": config.prefill_once,
           "line_ids": config.line_ids}
    dtype = sampling_dtype(config)  # the dtype changes the samples
    if dtype is not None:
        cfg["dtype"] = dtype
    if (out / SAMPLES).is_file():
        PAVE_FINGERPRINT.check(out, cfg, lambda diffs: (
            f"{out} holds samples made with different settings or inputs "
            f"({', '.join(d.key if d.recorded else f'{d.key} (not recorded there)' for d in diffs)}); "
            "use another --output"), advice="use another --output")
    PAVE_FINGERPRINT.write(out, cfg)
    for derived in ("pave.json", "pave.md"):  # a stopped run never leaves an earlier run's numbers behind
        (out / derived).unlink(missing_ok=True)
    sampler = make_sampler(config.backend, dataclasses.asdict(config), config.stability)
    try:
        lines = collect(records, sampler, config, out)
    except BackendError as exc:  # its text is scrubbed of the key by the backend
        raise RunFailure(f"{scrub(exc)}. Finished claims are saved in {out / SAMPLES}; "
                         "rerun the same command to resume") from None
    finally:
        sampler.close()
    res = analyse(lines, tune_fraction=config.tune_split, seed=config.seed, mode=config.stability,
                  refusals=not config.keep_refusals, jsd_condition=lambda cond: jsd_condition(cond, config),
                  jsd_settings={"runs": config.jsd_samples, "temperature": config.jsd_temperature})
    if fae_run is not None:
        _fae_check(res, lines, fae_run, config)
    res["config"] = cfg
    atomic_write_json(out / "pave.json", res)
    atomic_write_text(out / "pave.md", render_markdown(res, cfg))
    for line in summary_lines(res):
        print(line)
    print(f"wrote {out / 'pave.json'} and {out / 'pave.md'}")
    outputs = {"output": str(out), "samples": str(out / SAMPLES), "pave": str(out / "pave.json"),
               "report": str(out / "pave.md")}
    return CommandResult(outputs=outputs, summary=res)


def _fae_check(res: dict, lines: list[dict], fae_run, config: PaveConfig) -> None:
    """--check-run: the gold-evidence vs round-0 comparison, and a note when the run is of another verifier."""
    chk = res["fae_check"] = fae_round0_check(lines, fae_run.claims, fae_run=str(config.check_run),
                                              temperature=config.temperature)
    same = (fae_run.config.get("model") == config.model
            and fae_run.config.get("adapter_sha256") == adapter_sha256(config.adapter))
    chk["same_verifier"] = same
    if not same:
        res["notes"].append(f"--check-run {config.check_run} was made with model "
                            f"{fae_run.config.get('model')!r} and another adapter or model than this PAVE run: "
                            "the comparison is between two verifiers")
    if chk["disagree"]:
        res["notes"].append("PAVE's gold-evidence accuracy and FAE's round-0 accuracy differ by more than "
                            f"{FAE_GAP_POINTS:.0f} points: {chk['explanation']}")
