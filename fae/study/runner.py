"""`fae study` as a library: one model asked every condition of the evaluation-choice grid (SPEC §10), every
answer saved.

:func:`run` takes a :class:`StudyConfig` (the command's config: the dispatcher generates its parser); the command
and Python callers call it; the asking itself (each condition's prompt, answered in batches) is
:mod:`fae.study.asking`.

Units x sources x budgets x formats x replicates, then the greedy controls of the hash-selected claims,
over the pools of `real-data retrieve` (``--pools DIR``). The output directory gets ``study.json`` (the
settings and the inputs' hashes: a resume with other ones is refused), ``units.jsonl`` (gold and
submitted evidence, what ``fae study-report`` scores with) and ``responses.jsonl`` (one line per prompt,
parse failures included, appended a batch at a time; rerunning the command resumes and writes the same
bytes as a run that never stopped). ``--shard I/N`` answers the claims of shard I only, into
``shards/I-of-N/``; the same command without ``--shard`` counts the shards' answers as done and writes
the whole file. docs/study.md describes the files.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from real_fae_core.command import CommandConfig, CommandResult, command_line, field_names, option
from real_fae_core.errors import RunFailure, UserError
from real_fae_core.outputs import any_of, claim_dir
from real_fae_core.hashing import sha256_file
from real_fae_core.modelref import portable_name
from real_fae_core.runlock import RunLock
from real_fae_core.secrets import scrub
from data_prep.retrieval.pack import load_tokenizers, token_lengths
from fae.ablation.runio import adapter_sha256
from fae.ablation.shards import parse_shard
from fae.backends import BackendError, backend_options, get_backend
from fae.comparison.families_file import check_covers, check_known, read_families
from fae.backends.hf import HFOptions
from fae.backends.options import (HFLoadFields, OpenAIServingFields, ServingFields, VLLMServingFields, backend_field,
                                 sampling_dtype)
from fae.study import responses
from fae.study.grid import (CONTROL_CLAIMS, Condition, Pools, check_formats, control_claims, control_conditions,
                            key_of, load_pools, primary_conditions, sample_claims)
from fae.study.interfaces import ANSWER_TOKENS, FORMATS, submitted_evidence
from fae.study.replicates import PAPER_SEEDS, SamplingParams, replicate_plan
from fae.study.asking import Asker, ask, progress_bar

BACKENDS = ("hf", "openai", "vllm")
SCHEME = "study-1"  # the prompt, reader and seeding of fae.study; a change makes old answers another study


@dataclasses.dataclass
class StudyFields:
    """`fae study`'s own options; the backends' follow in :class:`StudyConfig`."""

    pools: str = option(help="an output directory of `real-data retrieve` (records.jsonl, misses.jsonl): one "
                             "dataset, packed with --budgets, ideally with --reranker")
    output: str = option(help="the study directory (resumed if present)")
    model: str = option(help="model path (hf, vllm) or served model name (openai)")
    backend: str = option("hf", choices=BACKENDS)
    adapter: str | None = option(None, help="PEFT LoRA adapter directory (hf, vllm)")
    formats: list[str] = option(default_factory=lambda: list(FORMATS),
                                help="answer formats (default: codes labels)")
    budgets: list[int] | None = option(None, help="packed budgets to ask (default: every one of the pools)")
    seeds: list[int] = option(default_factory=lambda: list(PAPER_SEEDS),
                              help="sampled replicates' seeds (default the paper's five); replicate 0 is greedy")
    temperature: float = option(0.7, above=0)
    top_p: float = option(0.8, above=0, max=1)
    top_k: int = option(20, min=0)
    control_claims: int = option(CONTROL_CLAIMS, min=0, help=f"hash-selected claims of the greedy controls (default "
                                                             f"{CONTROL_CLAIMS}; 0: none)")
    tokenizer: list[str] | None = option(None, action="append",
                                         help="a tokenizer the budgets are counted in, for the gold control (repeat "
                                              "per model of the study; default with --backend hf: the model's)")
    limit: int | None = option(None, min=1, help="only the first N claims (every unit of each)")
    sample: int | None = option(None, min=1, metavar="N",
                                help="a subset of at least N claims, whole families in the order of a hash of the "
                                     "family (families from --families; else each claim is one)")
    families: str | None = option(None, help="`real-data families` file of the pools, for --sample")
    units_from: str | None = option(None, metavar="STUDY",
                                    help="ask exactly the units another `fae study` output of the same pools asked "
                                         "(its --limit/--sample record carried over): a new model on the same units "
                                         "after the families file that sampled them has changed")
    chunk_size: int = option(64, min=1, help="prompts per backend call and per write")
    shard: str | None = option(None, metavar="I/N", help="answer shard I of N (0-based) into OUTPUT/shards/I-of-N")
    progress: bool = True  # --no-progress


@dataclasses.dataclass
class StudyHFFields:
    """`fae study`'s option of the hf backend beside its loading options (:class:`HFLoadFields`)."""

    batch_size: int = backend_field(HFOptions, "batch_size")


@dataclasses.dataclass
class StudyConfig(ServingFields, HFLoadFields, StudyHFFields, StudyFields, CommandConfig):
    """`fae study`: every condition of the evaluation-choice grid for one model."""

    # the study's fields, then the hf, vllm and openai backends' options, each under its heading (their
    # fields' `group`)
    COMMAND_FIELDS = field_names(StudyFields, StudyHFFields, HFLoadFields, VLLMServingFields, OpenAIServingFields)


def study_fingerprint(config: StudyConfig, pools: Pools, budgets: list[int], formats: list[str],
                      pool_units: list[str] | None = None) -> dict:
    """study.json: what makes these answers these answers (:data:`fae.study.responses.FINGERPRINT`) and more;
    ``pool_units`` (every unit of the pools, before --limit/--sample) lets the report check a families file."""
    tokenizers = config.tokenizer or ([config.model] if config.backend == "hf" and config.control_claims else [])
    return {"scheme": SCHEME, "pools": pools.path, "pools_sha256": pools.sha256, "dataset": pools.dataset,
            "backend": config.backend, "model": config.model, "model_name": portable_name(config.model),
            "adapter": config.adapter,
            "adapter_sha256": adapter_sha256(config.adapter), "dtype": sampling_dtype(config),
            "formats": formats, "budgets": budgets, "sources": list(range(pools.n_sources)),
            "seeds": list(config.seeds), "sampling": {"temperature": config.temperature, "top_p": config.top_p,
                                                       "top_k": config.top_k},
            "max_new_tokens": ANSWER_TOKENS, "control_claims": config.control_claims, "tokenizers": tokenizers,
            "missed_relevant": pools.missed_relevant, "notes": pools.notes, **selection_of(config, pools),
            "pool_units": sorted(pool_units if pool_units is not None else [u.id for u in pools.units])}


def selection_of(config: StudyConfig, pools: Pools) -> dict:
    """study.json's record of how the claims were chosen (``limit``, ``sample``); with ``--units-from`` the other
    study's record, which chose these units, and ``units_from`` naming that study."""
    if config.units_from:
        ref = _json_of(Path(config.units_from) / responses.STUDY)
        return {"limit": ref.get("limit"), "sample": ref.get("sample"), "units_from": config.units_from}
    return {"limit": config.limit,
            "sample": None if not config.sample else {"claims": config.sample,
                                                      "families_sha256": sha256_file(config.families)
                                                      if config.families else None,
                                                      "selected_claims": len({u.claim_id for u in pools.units})}}


def _json_of(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--units-from: {path} not found: give a `fae study` output directory") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"--units-from: {path}: not a study.json ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"--units-from: {path}: not a study.json (a JSON object)")
    return data


def same_units(pools: Pools, config: StudyConfig) -> Pools:
    """The pools' units that the study in ``--units-from`` asked: same pools (their SHA-256), every unit found."""
    where = Path(config.units_from)
    ref = _json_of(where / responses.STUDY)
    if ref.get("pools_sha256") != pools.sha256:
        raise UserError(f"--units-from {where}: its study asked other pools (pools_sha256 {ref.get('pools_sha256')}, "
                        f"--pools {pools.path} is {pools.sha256}): units are the same only on the same pools")
    units = where / responses.UNITS
    try:
        ids = [json.loads(line)["id"] for line in units.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        raise UserError(f"--units-from: {units} not found: give a `fae study` output directory") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"--units-from: {units}: not a units file ({type(exc).__name__}: {exc})") from None
    known = {u.id for u in pools.units}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise UserError(f"--units-from: {units}: unit {unknown[0]!r} is not in --pools {pools.path}")
    keep = set(ids)
    kept = [u for u in pools.units if u.id in keep]
    claims = {u.claim_id for u in kept}
    return dataclasses.replace(pools, units=kept,
                               missed_relevant={c: n for c, n in pools.missed_relevant.items() if c in claims})


def unit_rows(pools: Pools, budgets: list[int], controls: set[str]) -> list[dict]:
    """units.jsonl: per unit its gold and, per budget and source, the evidence shown and submitted."""
    rows = []
    for u in pools.units:
        submitted = {str(b): [submitted_evidence([u.sentences[i] for i in u.shown(s, b)], pools.dataset)
                              for s in range(pools.n_sources)] for b in budgets}
        rows.append({"id": u.id, "claim_id": u.claim_id, "dataset": u.dataset, "gold_label": u.gold_label,
                     "groups": u.groups, "document": u.document, "from_misses": u.from_misses,
                     "n_sentences": len(u.sentences), "submitted": submitted, "control": u.claim_id in controls})
    return rows


def check_config(config: StudyConfig, pools: Pools) -> tuple[list[int], list[str]]:
    """(budgets, formats) after the checks a parser cannot make, one line each."""
    if config.backend not in BACKENDS:
        raise UserError(f"fae study supports --backend {', '.join(BACKENDS)}, not {config.backend!r}")
    if pools.n_sources < 2:
        raise UserError(f"--pools {pools.path}: the pools have one ordering only (retrieved without --reranker): the "
                        "study compares two orderings and `fae study-report` refuses one; retrieve again with "
                        "--reranker")
    formats = check_formats(config.formats)
    budgets = sorted(config.budgets) if config.budgets else pools.budgets
    unknown = [b for b in budgets if b not in pools.budgets]
    if unknown or len(set(budgets)) != len(budgets):
        raise UserError(f"--budgets {' '.join(map(str, config.budgets or []))}: the pools hold budgets "
                        f"{' '.join(map(str, pools.budgets))}, each once")
    try:
        SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                       seeds=tuple(config.seeds))
    except ValueError as exc:
        raise UserError(f"--seeds/--temperature/--top-p/--top-k: {exc}") from None
    return budgets, formats


def plan(pools: Pools, config: StudyConfig, budgets: list[int], formats: list[str]) -> tuple[list, set[str]]:
    """Every condition of the study in the responses file's order, and the control claims."""
    sources = list(range(pools.n_sources))
    replicates = [r.index for r in replicate_plan(SamplingParams(seeds=tuple(config.seeds)))]
    chosen = set(control_claims(pools.units, config.control_claims)) if config.control_claims else set()
    out: list[Condition] = []
    for u in pools.units:
        out += primary_conditions(u, sources, budgets, formats, replicates)
    for u in pools.units:
        if u.claim_id in chosen:
            out += control_conditions(u, sources, budgets, formats)
    return out, chosen


def limited(pools: Pools, config: StudyConfig) -> Pools:
    """The pools of the first ``--limit`` claims, of the ``--sample`` (every unit of each claim), or the units
    another study asked (``--units-from``)."""
    if sum(map(bool, (config.limit, config.sample, config.units_from))) > 1:
        raise UserError("--limit, --sample and --units-from each choose the claims: give one")
    if config.families and not config.sample:
        raise UserError("--families chooses whole families for --sample: give --sample N too")
    if config.units_from:
        return same_units(pools, config)
    if config.sample:
        families = {}
        if config.families:
            read = read_families(config.families)
            check_known(config.families, read, {u.id for u in pools.units}, f"--pools {pools.path}")
            check_covers({fid: (fam, config.families, line) for fid, (fam, line) in read.items()},
                         [(u.id, u.claim_id, f"--pools {pools.path}") for u in pools.units], [config.families])
            families = {fid: fam for fid, (fam, _) in read.items()}
        keep = set(sample_claims(pools.units, config.sample, families))
    elif config.limit:
        keep = set(list(dict.fromkeys(u.claim_id for u in pools.units))[:config.limit])
    else:
        return pools
    return dataclasses.replace(pools, units=[u for u in pools.units if u.claim_id in keep],
                               missed_relevant={c: n for c, n in pools.missed_relevant.items() if c in keep})


def shard_units(pools: Pools, i: int, n: int) -> set[str]:
    """The unit ids of shard ``i`` of ``n``: whole claims dealt in turn (a claim's abstracts stay together)."""
    claims = list(dict.fromkeys(u.claim_id for u in pools.units))
    mine = {c for k, c in enumerate(claims) if k % n == i}
    return {u.id for u in pools.units if u.claim_id in mine}


def swap_partners(pools: Pools, chosen: set[str]) -> dict[str, str]:
    """Each selected unit's swap partner: the next selected unit (cyclically) of another claim."""
    units = [u for u in pools.units if u.claim_id in chosen]
    out = {}
    for k, u in enumerate(units):
        for step in range(1, len(units)):
            other = units[(k + step) % len(units)]
            if other.claim_id != u.claim_id:
                out[u.id] = other.id
                break
    return out


def backend_of(config: StudyConfig):
    """(the backend's class, its options): its answer cap the study's 16 tokens and no label probabilities (the
    study reads text)."""
    cls = get_backend(config.backend)
    names = {f.name for f in dataclasses.fields(cls.options_class)}
    values = {k: v for k, v in dataclasses.asdict(config).items() if k in names}
    values.update(max_new_tokens=ANSWER_TOKENS, label_probs=False)
    return cls, backend_options(cls, values)


def check_backend(config: StudyConfig) -> None:
    """Refuse a backend that cannot load here (vLLM not installed, no CUDA device) before the output is created:
    found only when the first prompt is asked, it would leave a study.json of that backend behind, and a rerun
    of the same --output with another backend would be refused as another study."""
    cls, options = backend_of(config)
    cls.check_ready(options)


def open_backend(config: StudyConfig):
    """The study's backend, loaded (a model, a client): the caller closes it."""
    cls, options = backend_of(config)
    return cls(options)


def token_counter(tokenizers: list[str]):
    """The most tokens any of ``tokenizers`` counts for a list of unit texts (None without tokenizers)."""
    if not tokenizers:
        return None
    loaded = load_tokenizers(tokenizers)
    return lambda texts: max(sum(n) for n in token_lengths(loaded, list(texts)).values())


def run(config: StudyConfig) -> CommandResult:
    """`fae study` as a function: the responses of every condition (one shard's with ``--shard``) in
    ``config.output``, resumed where a kill left them; bad pools or options are one :class:`UserError`."""
    whole = load_pools(config.pools)
    pools = limited(whole, config)
    budgets, formats = check_config(config, pools)
    check_backend(config)
    shard = parse_shard(config.shard) if config.shard else None
    out = Path(config.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; give a directory")
    guard = claim_dir(out, "fae study", inputs=[config.pools, config.adapter],
                      legacy=any_of(responses.STUDY, responses.RESPONSES, responses.UNITS, responses.SHARDS))
    fp = study_fingerprint(config, pools, budgets, formats, [u.id for u in whole.units])
    conditions, chosen = plan(pools, config, budgets, formats)
    if shard is not None:
        mine = shard_units(pools, *shard)
        conditions = [c for c in conditions if c.unit in mine]
        fp = {**fp, "shard": {"index": shard[0], "count": shard[1]}}
    where = out / responses.SHARDS / f"{shard[0]}-of-{shard[1]}" if shard else out
    guard.mark(files=())
    with RunLock(where, "fae study", is_dir=True):
        return _study(config, pools, fp, conditions, chosen, where, budgets)


def _study(config, pools: Pools, fp: dict, conditions: list, chosen: set[str], where: Path,
           budgets: list[int]) -> CommandResult:
    responses.check_fingerprint(where, fp)
    done_lines = responses.read_responses(where / responses.RESPONSES, repair=True)
    if "shard" not in fp:  # the shards of this study count as done
        for sdir in responses.shard_dirs(where):
            responses.check_fingerprint(sdir, fp, "a shard")
            done_lines += responses.read_responses(sdir / responses.RESPONSES)
    fp["command"] = command_line("fae study", config)  # the line that resumes it
    responses.write_start(where, fp, unit_rows(pools, budgets, chosen))
    done = {key_of(x) for x in done_lines}
    todo = [c for c in conditions if c.key not in done]
    replicates = {r.index: r for r in replicate_plan(SamplingParams(seeds=tuple(config.seeds)))}
    asker = Asker(pools.dataset, {u.id: u for u in pools.units}, replicates,
                  SamplingParams(config.temperature, config.top_p, config.top_k, tuple(config.seeds)),
                  swap_partners(pools, chosen), token_counter(fp["tokenizers"]) if chosen else None)
    print(f"fae study: {len(todo)} of {len(conditions)} prompts to ask ({pools.dataset}, {len(pools.units)} units)",
          file=sys.stderr)
    if todo:
        backend = open_backend(config)
        bar = progress_bar(len(conditions), len(conditions) - len(todo), "fae study", config.progress)
        writer = responses.ResponseWriter(where / responses.RESPONSES)
        try:
            ask(backend, asker, todo, writer, config.chunk_size, bar)
        except BackendError as exc:
            raise RunFailure(f"{scrub(exc)}. Answers so far are saved in {where / responses.RESPONSES}; "
                             "rerun the same command to resume") from None
        finally:
            writer.close()
            backend.close()
            if bar is not None:
                bar.close()
    lines = responses.read_responses(where / responses.RESPONSES) + (done_lines if "shard" not in fp else [])
    merged = responses.merge_in_order(lines, [c.key for c in conditions], key_of)
    if len(merged) == len(conditions):
        responses.rewrite_responses(where / responses.RESPONSES, merged)
    print(f"fae study: {len(merged)} of {len(conditions)} prompts answered -> {where / responses.RESPONSES}",
          file=sys.stderr)
    return CommandResult(outputs={"study": str(where), "responses": str(where / responses.RESPONSES)},
                         summary={"prompts": len(conditions), "answered": len(merged)})
