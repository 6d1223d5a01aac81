"""`real-demo --output DIR`: the paper's ablation table in miniature, live, on a CPU.

Every stage runs the framework's real code path, the one a GPU user runs on
Llama-3.1-8B-Instruct: records (with incomplete gold) → ``real-data enhance``
against three simulated annotators (``real.demo.annotators``: a local
OpenAI-compatible server; real client, majority vote and cache) →
``real-data pairs`` for the four variants of SPEC §4 (sft, no_ablation,
no_enhancement, real) and REAL with shortcut-breaking and sufficiency pairs
(real_sufficient) → ``accelerate launch -m real.train`` with ``recipes/demo/*.yaml`` and
``accelerate_configs/cpu.yaml`` → ``fae run`` (R = 4, with the matched control arm and
the gold-only, cited-only and size-sweep pools) → ``fae probe`` → ``fae report``, ``fae probe-report`` and
``fae compare`` (sft vs real), the incomplete-gold subset table, then
``fae pave`` on a few test claims with the world's counter-entity and
counter-semantic evidence (the SFT vs REAL arbitration profile). The base
model is the tiny Llama shipped in ``real/demo/base`` (rebuild it with
``real-demo build-base``); the data is the seeded synthetic world of
``real.demo.world``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

from real_fae_core.atomicio import atomic_write_json, atomic_write_text
from real_fae_core.outputs import delegate
from real_fae_core.command import CommandResult
from real_fae_core.errors import UserError
from real_fae_core.hardware import cpu_allocator_env, cpu_family, cpu_model_name
from real_fae_core.runlock import LOCK_NAME, RunLock
from data_prep.enhance.runner import EnhanceConfig
from data_prep.enhance.runner import run as real_data_enhance
from data_prep.pairs.runner import PairsConfig
from data_prep.pairs.runner import run as real_data_pairs
from data_prep.records import load_records, save_records
from fae.ablation.metrics import compute_metrics
from fae.ablation.runner import run as fae_run
from fae.ablation.runner import FaeRunConfig
from fae.ablation.report import ReportConfig
from fae.ablation.report import run as fae_report
from fae.comparison.compare import CompareConfig
from fae.comparison.compare import run as fae_compare
from fae.pave.runner import PaveConfig
from fae.pave.runner import run as fae_pave
from fae.probes.runner import ProbeConfig
from fae.probes.runner import run as fae_probe
from fae.probes.report import ProbeReportConfig
from fae.probes.report import run as fae_probe_report
from fae.view.runner import ViewConfig
from fae.view.runner import run as fae_view
from fae.pave.analysis import analyse
from fae.pave.io import SAMPLES, jsd_condition, read_samples
from fae.probes.knowledge import shares_text
from fae.probes.report import load_probe, markdown_table

from .drift import ON_POLICY, drift_lines, drift_report, reference_for
from .annotators import AnnotatorServer, enhancement_quality, write_annotators_yaml
from .world import add_counterfactuals, add_incomplete_gold, build_world, make_split, train_test_facts

PACKAGE_DIR = Path(__file__).resolve().parent
BASE_DIR = PACKAGE_DIR / "base"
REPO_DIR = PACKAGE_DIR.parents[1]
# SPEC §4: the paper's Table 2 rows, then REAL with shortcut-breaking and sufficiency pairs (real_sufficient:
# real_matched's rows, whose matched positives break the hole cue, plus positives on the evidence alone and on
# shorter pools that hold it and negatives at every pool size): neither a hole, nor a pool's size, nor where a
# line went predicts NEI there. real_matched itself is no longer trained by the demo (its pairs are a subset of
# real_sufficient's; docs/demo.md has its numbers).
VARIANTS = ("sft", "no_ablation", "no_enhancement", "real", "real_sufficient")
PAVE_VARIANTS = ("sft", "real")  # the arbitration profile: standard SFT vs REAL
# On-policy evidence ablation (SPEC §4, `trainer: grpo`; real-demo --on-policy): GRPO from real_sufficient's
# adapter on real_sufficient's prompts, rewarded by the verifier's own ablations (recipes/demo/on_policy.yaml).
ON_POLICY_START = "real_sufficient"
# The demo's tiny model is evaluated in fp32 everywhere: its committed numbers
# (benchmarks/results/demo_cpu_summary.json) were measured so, and `--dtype auto` is bf16 on a CPU with
# native bf16, whose greedy answers can differ on near ties.
DEMO_DTYPE = "fp32"


@dataclass
class DemoSize:
    """How much the demo does; the CI test runs a reduced size through the same code."""

    n_train: int = 400
    n_test: int = 200
    max_steps: int | None = None  # None = the recipe's epochs
    bootstrap: int = 2000
    pave_claims: int = 20  # `fae pave` on the first N test claims, with N = K = pave_samples (~10 s each); 0 = skip
    pave_samples: int = 4
    incomplete_share: float = 0.35  # claims whose gold names one of two proving lines (world.add_incomplete_gold)
    on_policy: bool = False  # also train ON_POLICY from real_sufficient's adapter (real-demo --on-policy)
    on_policy_steps: int | None = None  # None = recipes/demo/on_policy.yaml's max_steps


def demo_variants(size: "DemoSize") -> tuple[str, ...]:
    """The variants a demo of ``size`` trains and reports, in report order."""
    return VARIANTS + ((ON_POLICY,) if size.on_policy else ())


# What a demo run writes in its output directory; a rerun replaces all of it.
OUTPUT_DIRS = ("data", "models", "runs", "probes", "compare", "logs", "pave", "view")
OUTPUT_FILES = ("summary.json", "drift.json", "report.md", "trajectory.png", "soft_trajectory.png",
                "reliability.png", "sufficiency.png",
                "dirk.png", "dirk.md")
MARKER = ".real-demo"  # written first: this directory is a demo output, safe to replace
# the committed full demo (seed 0, default size, fp32) per CPU family: every run says which headline numbers
# moved from its own family's, or from another family's ("another CPU") where its own was never measured
REFERENCE_DIR = REPO_DIR / "benchmarks" / "results" / "demo_reference"


def claim_output(out: Path) -> RunLock:
    """Lock ``out`` for this run and clear the previous demo's results from it.

    A second demo on the same output stops at once (the lock names the holder),
    instead of deleting the first one's data under it. A directory that is not a
    demo output (no marker, no summary.json, not empty) is refused rather than
    cleared: ``--output .`` in a project must not delete its ``data/``. The
    previous run's top-level files go too, so a run killed midway never leaves
    an old ``summary.json`` beside new partial runs.
    """
    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out, "real-demo", is_dir=True).acquire()
    entries = sorted(p.name for p in out.iterdir() if p.name not in (LOCK_NAME, MARKER))
    if entries and not ((out / MARKER).exists() or (out / "summary.json").exists()):
        lock.release()
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UserError(f"{out} is not empty and not a real-demo output (holds {shown}); a demo run "
                        "replaces its output directory: pass a new or empty --output")
    atomic_write_text(out / MARKER, "written by real-demo; the directory is replaced by each demo run\n")
    delegate(out)  # its fae report and fae probe-report write report.md, dirk.md ... into it
    for sub in OUTPUT_DIRS:
        shutil.rmtree(out / sub, ignore_errors=True)
    for name in OUTPUT_FILES:
        (out / name).unlink(missing_ok=True)
    return lock


def _stage(msg: str, t0: float) -> None:
    print(f"[real-demo {time.time() - t0:6.1f}s] {msg}", flush=True)


def _repo_file(rel: str) -> Path:
    path = REPO_DIR / rel
    if not path.exists():
        raise UserError(
            f"{rel} not found beside the package ({REPO_DIR}); run the demo from a source checkout "
            "installed with `pip install -e .`"
        )
    return path


def run_stage(cmd: list[str], log_path: Path, env: dict | None = None) -> None:
    """Run one stage as a subprocess; its full output goes to a log file (see :func:`run_stages`)."""
    run_stages([(cmd, log_path, None)], env)


def run_stages(stages: list[tuple[list[str], Path, str | None]], env: dict | None = None, lanes: int = 1,
               t0: float | None = None) -> None:
    """Run stages as subprocesses, at most ``lanes`` at once, in order; each one's output goes to its log file.

    Each stage runs in its own process group, and if the demo stops (Ctrl-C,
    SIGTERM, an error, a failed stage) every running group is stopped with it:
    ``accelerate launch`` starts ``real.train`` as a grandchild, which would
    otherwise go on training into a directory the next demo run deletes. A
    stage's ``message`` is printed as a stage line when it starts.
    """
    waiting, running = list(stages), {}  # running: each stage's proc.wait() future -> (proc, cmd, log_path)
    with ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="stage-wait") as pool:
        try:
            while waiting or running:
                while waiting and len(running) < lanes:  # started here, in order: the stage lines keep theirs
                    cmd, log_path, message = waiting.pop(0)
                    if message:
                        _stage(message, t0 if t0 is not None else time.time())
                    with log_path.open("w") as log:
                        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_DIR,
                                                start_new_session=True)
                    running[pool.submit(proc.wait)] = (proc, cmd, log_path)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in [f for f in running if f in done]:  # in starting order
                    proc, cmd, log_path = running.pop(future)
                    if proc.returncode != 0:
                        tail = "".join(log_path.read_text().splitlines(True)[-25:])
                        raise UserError(f"stage failed ({' '.join(cmd[:6])} ...), exit {proc.returncode}; "
                                        f"log {log_path}:\n{tail}")
        except BaseException:
            for proc, _, _ in running.values():
                _stop_group(proc)  # their proc.wait() returns, so the pool's threads end
            raise


def training_lanes(cpus: int | None) -> tuple[int, int]:
    """(trainings at once, threads each). The demo model is tiny: a second thread barely speeds a step up,
    so two one-thread trainings side by side on two cores finish well before two two-thread ones in a
    row, and give the same adapters bit for bit (measured: docs/demo.md)."""
    cpus = cpus or 1
    lanes = 2 if cpus >= 2 else 1
    return lanes, max(1, cpus // lanes)


def _stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the stage's process group (the trainer exits cleanly on it), SIGKILL what is left after ``grace``."""
    import signal

    def signal_group(sig: int) -> bool:
        proc.poll()  # reap the leader once it exits, so only live members count
        try:
            os.killpg(proc.pid, sig)
            return True
        except ProcessLookupError:
            return False

    if signal_group(signal.SIGTERM):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and signal_group(0):
            time.sleep(0.2)
        signal_group(signal.SIGKILL)
    proc.wait()


def _call(command, config) -> CommandResult:
    """Run a command as a function (real_fae_core.command): the same config and checks as its command line."""
    result = command(config)
    if not result.ok:
        raise UserError(f"{type(config).__name__}: the command failed with exit code {result.exit_code}")
    return result


def write_world_records(out: Path, size: DemoSize, seed: int) -> tuple[Path, Path]:
    """The demo world's train and test records (incomplete gold and counterfactuals added) under
    ``out``/data; their paths. The same ``size`` and ``seed`` write the same files."""
    world = build_world(seed=seed)
    train_facts, test_facts = train_test_facts(world, size.n_train, size.n_test, seed=seed + 10)
    train = make_split(world, train_facts, seed=seed + 11, prefix="demo-train")
    test = make_split(world, test_facts, seed=seed + 12, prefix="demo-test")
    # post-processing with RNGs of their own, after the world: nothing above changes
    add_incomplete_gold(train, seed=f"train-{seed}", share=size.incomplete_share)
    add_incomplete_gold(test, seed=f"test-{seed}", share=size.incomplete_share)
    add_counterfactuals(world, test, seed=seed + 13)
    data = out / "data"
    save_records(train, data / "train.jsonl")
    save_records(test, data / "test.jsonl")
    return data / "train.jsonl", data / "test.jsonl"


def enhance_step(out: Path, train_path: Path, seed: int, t0: float) -> tuple[Path, dict]:
    """`real-data enhance` on the train records against the simulated annotators.

    The real command (client, retries, majority vote, SQLite cache) talks to
    :class:`~real.demo.annotators.AnnotatorServer` through an annotators YAML
    written beside the data. Returns the enhanced records' path and the
    enhancement's precision/recall against the world's true proving lines.
    """
    data = out / "data"
    enhanced = data / "train.enhanced.jsonl"
    with AnnotatorServer() as server:
        yaml_path = write_annotators_yaml(data / "annotators.yaml", server.base_url, seed=seed)
        _stage(f"real-data enhance: 3 simulated annotators at {server.base_url} (majority vote, cache)", t0)
        log = out / "logs" / "enhance.log"
        with log.open("w") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
            rc = real_data_enhance(EnhanceConfig(records=train_path, annotators=yaml_path, output=enhanced,
                                                 no_progress=True)).exit_code
        if rc:
            raise UserError(f"`real-data enhance` failed with exit code {rc}; log {log}:\n{log.read_text()[-2000:]}")
    quality = enhancement_quality(load_records(enhanced))
    quality["summary"] = json.loads((data / "train.enhanced.jsonl.summary.json").read_text())["requests"]
    return enhanced, quality


def base_reference_dir(variant: str) -> str:
    """probes/<this>: the variant's DirK with h(K) from the base model (`--knowledge-reference base`)."""
    return f"{variant}-base-hK"


def dirk_lines(out: Path, variants: tuple[str, ...] = VARIANTS) -> list[str]:
    """The report's DirK section: what each variant answers on the claim-only prompt (h(K)'s prompt),
    what DirK then measures, and DirK with h(K) from the base model, from ``probes/*/dirk.json``."""
    lines = ["", "## DirK: what h(K) stands for (`fae probe`)", "",
             "DirK (dirk.md, dirk.png) measures drift toward h(K), the state on the claim-only prompt. It is a "
             "direction toward parametric knowledge only where the verifier answers from knowledge there.", "",
             "| Variant | claim-only answers (greedy) | correct (%) | abstaining reference |",
             "| --- | --- | --- | --- |"]
    notes = []
    for variant in variants:
        probe = json.loads((out / "probes" / variant / "dirk.json").read_text())
        answers = probe["knowledge_answers"]["verifier"]
        correct = answers.get("correct")
        lines.append(f"| {variant} | {shares_text(answers)} | {_pct(correct)} "
                     f"| {'**yes**' if probe['abstaining_reference'] else 'no'} |")
        if probe["reference_note"]:
            notes.append(f"- {variant}: {probe['reference_note']}")
    lines += [""] + notes if notes else []
    based = [out / "probes" / base_reference_dir(v) for v in variants]
    if all((d / "dirk.json").is_file() for d in based):
        lines += ["", "DirK with h(K) from the base model without the adapter (`fae probe --knowledge-reference "
                  "base`): every variant's drift toward the same state, the base model's answer from its "
                  "parametric knowledge; mean [95% bootstrap CI].", "",
                  *markdown_table(list(variants), [load_probe(d) for d in based]).splitlines()]
    return lines


def subset_metrics(run_dir: Path, ids: set[str]) -> dict:
    """FAE metrics (fae.ablation.metrics.compute_metrics, the one definition) on the claims in ``ids``."""
    claims = [json.loads(line) for line in (run_dir / "claims.jsonl").read_text().splitlines() if line.strip()]
    m = compute_metrics([c for c in claims if c["id"] in ids])
    return {k: m[k] for k in ("n_claims", "label_accuracy", "strict_accuracy", "evidence_precision",
                              "evidence_recall", "round_accuracy", "IS", "ER", "IO")}


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def enhancement_lines(q: dict) -> list[str]:
    """report.md: how well gold and the enhanced evidence cover the true proving lines of the train claims."""
    lines = ["", "## Evidence enhancement (`real-data enhance`, simulated annotators)", "",
             f"{q['n_claims']} train claims, {q['n_incomplete_gold']} with incomplete gold (a second line proves "
             "the claim; gold names one). Micro precision/recall (×100) against the world's true proving lines; "
             "the annotators are a seeded simulation (real/demo/annotators.py), the client, vote and cache are "
             "`real-data enhance`'s own.", "",
             "| evidence | Prec | Rec |", "| --- | --- | --- |",
             f"| gold (`evidence`) | {_pct(q['gold']['precision'])} | {_pct(q['gold']['recall'])} |",
             f"| enhanced (2 of 3 votes ∪ gold) | {_pct(q['enhanced']['precision'])} "
             f"| {_pct(q['enhanced']['recall'])} |"]
    for name, a in q["annotators"].items():
        lines.append(f"| annotator {name} | {_pct(a['precision'])} | {_pct(a['recall'])} |")
    return lines


def subset_lines(subsets: dict[str, dict]) -> list[str]:
    """report.md: the variants on the test claims whose gold is incomplete, and on the others."""
    lines = ["", "## Claims with incomplete gold (test split)", "",
             "Same runs, restricted to the test claims whose pool holds a second proving line that the gold "
             "does not name (and, for contrast, the others). Metrics of fae.ablation.metrics on the subset (×100).",
             "", "| Model | claims | Acc | Rec | Prec | IS | ER | IO | a_r |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for part, label in (("incomplete", "incomplete gold"), ("complete", "complete gold")):
        for variant, m in subsets[part].items():
            traj = " / ".join(_pct(a) for a in m["round_accuracy"])
            lines.append(f"| {variant} ({label}) | {m['n_claims']} | {_pct(m['label_accuracy'])} "
                         f"| {_pct(m['evidence_recall'])} | {_pct(m['evidence_precision'])} | {_pct(m['IS'])} "
                         f"| {_pct(m['ER'])} | {_pct(m['IO'])} | {traj} |")
    return lines


def _append(report: Path, lines: list[str]) -> None:
    atomic_write_text(report, report.read_text(encoding="utf-8") + "\n".join(lines) + "\n")


def counterfactual_check_line(test_path: Path, n_claims: int) -> str:
    """How many of the PAVE claims carry a counterfactual of each kind, and by which label check it passed."""
    checks: dict[str, Counter] = {}
    for rec in load_records(test_path)[:n_claims]:
        for kind, lines in rec.extra.get("counterfactual_sentences", {}).items():
            checks.setdefault(kind, Counter())[",".join(sorted({str(x.get("check")) for x in lines}))] += 1
    per_kind = "; ".join(f"{kind}: " + ", ".join(f"{n} of {n_claims} passed by {how}" for how, n in sorted(c.items()))
                         for kind, c in sorted(checks.items()))
    return ("Counterfactuals carry the verdict opposite to the claim's gold label (PAVE's label consistency; "
            f"for a REFUTE claim the line states the claim's own value): {per_kind}. `rule`: provable in this "
            "world, where every (entity, attribute) has one value; `real-data counterfactual` checks real data "
            "with an LLM judge (docs/counterfactual.md).")


def _pave_step(out: Path, base: Path, test_path: Path, size: DemoSize, seed: int, t0: float) -> dict:
    """`fae pave` for sft and real on a few test claims, each beside its own FAE run; PAVE tables in report.md.

    The paper's settings (refusal filtering, Margin = Known + Unknown margins,
    states at temperature 0.3, the JSD rule at 1.0), with N = K = pave_samples
    to keep the demo short. Where filtering leaves nothing, the unfiltered
    profile is shown, labelled as such, and the report says what it cannot show.
    """
    kept, results = {}, {}
    for variant in PAVE_VARIANTS:
        _stage(f"{variant}: fae pave ({size.pave_claims} claims, N = K = {size.pave_samples})", t0)
        results[variant], kept[variant] = _pave_variant(out, base, test_path, size, seed, variant)
    _append(out / "report.md", _pave_report_lines(kept, results, test_path, size))
    return kept


def _pave_variant(out: Path, base: Path, test_path: Path, size: DemoSize, seed: int, variant: str):
    """(pave.json, the summary.json rows per counterfactual kind) of one variant's `fae pave`."""
    pave_dir = out / "pave" / variant
    _call(fae_pave, PaveConfig(records=test_path, output=pave_dir, backend="hf", model=base,
                               adapter=out / "models" / variant, limit=size.pave_claims,
                               samples=size.pave_samples, jsd_samples=size.pave_samples, max_new_tokens=16,
                               check_run=out / "runs" / variant, seed=seed, progress=False, dtype=DEMO_DTYPE))
    res = json.loads((pave_dir / "pave.json").read_text())
    cfg = SimpleNamespace(**res["config"])
    if not res["kinds"]:  # refusal filtering left nothing: the unfiltered profile, labelled as such
        lines = list(read_samples(pave_dir / SAMPLES).values())
        unfiltered = analyse(lines, tune_fraction=cfg.tune_split, seed=cfg.seed, mode=cfg.stability,
                             refusals=False,
                             jsd_condition=lambda c, a=cfg: jsd_condition(c, a),
                             jsd_settings={"runs": cfg.jsd_samples, "temperature": cfg.jsd_temperature})
        kinds, filtered = unfiltered["kinds"], False
    else:
        kinds, filtered = res["kinds"], True
    return res, {k: {"filtered": filtered, "PR": v["profile"]["PR"], "CR": v["profile"]["CR"],
                    "Margin": v["profile"]["Margin"], "margin_known": v["profile"]["margin_known"],
                    "margin_unknown": v["profile"]["margin_unknown"],
                    "margin_undefined": v["profile"]["margin_undefined"],
                    "pooled_margin": v["profile"]["pooled_margin"],
                    "states": {s: r["n"] for s, r in v["profile"]["states"].items()},
                    "refusals_removed": res["refusal_filter"]["removed_by_state"],
                    "variant": v["arbitration"]["variant"],
                    "IE": v["arbitration"]["IE"], "CE": v["arbitration"]["CE"], "OA": v["arbitration"]["OA"],
                    "gold_vs_fae_round0": res["fae_check"]}
                for k, v in kinds.items()}


def _pave_report_lines(kept: dict, results: dict, test_path: Path, size: DemoSize) -> list[str]:
    """report.md's PAVE section: the profile table, PAVE beside FAE round 0, and what it cannot show."""
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    num = lambda x: "n/a" if x is None else f"{x:+.3f}"  # noqa: E731
    margin = lambda m: ("undefined: " + "; ".join(m["margin_undefined"]) if m["margin_undefined"]  # noqa: E731
                        else num(m["Margin"]))
    any_res = next(iter(results.values()))["config"]
    lines = ["", "## PAVE: arbitration profile (`fae pave`)", "",
             f"{size.pave_claims} test claims; states, CR and PR from {size.pave_samples} sampled answers per "
             f"prompt at temperature {any_res['temperature']}, the JSD rule from {size.pave_samples} at "
             f"{any_res['jsd_temperature']} (the paper: 10 and 5); claims whose claim-only majority is "
             "NOT_ENOUGH_INFO or invalid are filtered out first (the paper's refusal filtering). Margin is the "
             "paper's: Known-state margin (PR_KK + CR_KU − 1) plus Unknown-state margin (PR_UK + CR_UU − 1). "
             "Details in pave/<variant>/pave.md.", "", counterfactual_check_line(test_path, size.pave_claims), "",
             "| Variant | Counterfactual | Claims analysed | KK / KU / UK / UU | CR | PR | Margin | JSD rule | IE | CE "
             "| OA |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for variant, kinds in kept.items():
        res = results[variant]
        n_after = res["n_claims"]
        for kind, m in kinds.items():
            analysed = (f"{n_after} of {res['refusal_filter']['claims_before']}" if m["filtered"]
                        else f"0 of {res['refusal_filter']['claims_before']}; unfiltered shown")
            st = " / ".join(str(m["states"][s]) for s in ("KK", "KU", "UK", "UU"))
            lines.append(f"| {variant} | {kind} | {analysed} | {st} | {pct(m['CR'])} | {pct(m['PR'])} "
                         f"| {margin(m)} | {m['variant']} | {pct(m['IE'])} | {pct(m['CE'])} | {pct(m['OA'])} |")
    lines += ["", "PAVE's gold-evidence accuracy (gold sentences only, sampled) beside the same verifier's FAE "
              "round-0 accuracy (full pool, greedy) on the same claims:", "",
              "| Variant | PAVE gold evidence | FAE round 0 | gap (points) | NEI on gold-only pools |",
              "| --- | --- | --- | --- | --- |"]
    for variant, res in results.items():
        chk = res["fae_check"]
        lines.append(f"| {variant} | {pct(chk['pave_gold_evidence_accuracy'])} | {pct(chk['fae_round0_accuracy'])} "
                     f"| {100 * chk['difference']:+.1f}{' **(> 10: flagged)**' if chk['disagree'] else ''} "
                     f"| {pct(chk['pave_gold_evidence_abstain_share'])} |")
    for variant, res in results.items():
        chk, filt = res["fae_check"], res["refusal_filter"]
        if not res["kinds"]:
            lines += ["", f"**{variant}: what this section cannot show.** Refusal filtering removed all "
                      f"{filt['claims_before']} claims: {variant} answers NOT_ENOUGH_INFO (or nothing valid) when "
                      "it sees no evidence, so it has no prior to persist in or to correct, and the paper's states, "
                      f"CR, PR and Margin do not exist for it. The {variant} rows above are the unfiltered profile "
                      "(abstaining priors counted as wrong), for reference only."]
        if chk["disagree"]:
            lines += ["", f"**{variant}: PAVE and FAE disagree by {abs(100 * chk['difference']):.0f} points.** "
                      f"On gold-only pools {variant} answered NOT_ENOUGH_INFO "
                      f"{100 * chk['pave_gold_evidence_abstain_share']:.0f}% of the time; FAE round 0 reads "
                      f"full pools, like every pool {variant} was trained on. FAE's gold-only and cited-only arms "
                      "(the sufficiency table above) ask the same short pools and show the same abstention, so "
                      "PAVE's CR and wrong-rate rows describe a verifier that does not answer on the evidence "
                      f"alone. They cannot show how {variant} corrects a wrong prior from evidence it would answer "
                      "on."]
    return lines


def run_demo(output: str | Path, size: DemoSize | None = None, seed: int = 0, base: str | Path | None = None) -> dict:
    """The whole demo into ``output`` (always fresh, locked): data, training of each variant, FAE; its summary.
    A missing base model is a :class:`UserError` saying how to build it."""
    size = size or DemoSize()
    out = Path(output)
    base = Path(base) if base else BASE_DIR
    if not (base / "config.json").exists():
        raise UserError(f"demo base model not found at {base}; build it with `real-demo build-base --output {base}`")
    accelerate_cfg = _repo_file("accelerate_configs/cpu.yaml")
    recipes = {v: _repo_file(f"recipes/demo/{v}.yaml") for v in demo_variants(size)}
    t0 = time.time()
    # A demo run always starts fresh: stale models must never be resumed into new runs.
    lock = claim_output(out)
    try:
        return _run_demo_locked(out, base, size, seed, accelerate_cfg, recipes, t0)
    finally:
        lock.release()


def train_variants(out: Path, base: Path, size: DemoSize, seed: int, enhanced_path: Path, accelerate_cfg: Path,
                   recipes: dict[str, Path], t0: float) -> None:
    """`real-data pairs` and `accelerate launch -m real.train` for every variant, trainings on parallel lanes."""
    logs = out / "logs"
    # the CPU allocator settings (real_fae_core.hardware): the same numbers, the steps faster
    env = cpu_allocator_env(dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"))
    # the demo trains on the CPU (use_cpu in its recipes): said to DeepSpeed, whose import otherwise warns in
    # every training log that it found no accelerator
    env.setdefault("DS_ACCELERATOR", "cpu")
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    lanes, threads = training_lanes(os.cpu_count())
    trainings = []
    for variant in VARIANTS:  # pairs-based trainings; ON_POLICY trains on real_sufficient's prompts below
        pairs = out / "data" / f"pairs-{variant}"
        _stage(f"{variant}: real-data pairs", t0)
        with (logs / f"pairs-{variant}.log").open("w") as fh, contextlib.redirect_stdout(fh), \
                contextlib.redirect_stderr(fh):
            _call(real_data_pairs, PairsConfig(records=enhanced_path, variant=variant, output=pairs, tokenizer=base,
                                               max_length=512, seed=seed))
        cmd = [accelerate, "launch", "--config_file", str(accelerate_cfg), "--num_cpu_threads_per_process",
               str(threads), "-m", "real.train", "--config", str(recipes[variant]), "--model_name_or_path", str(base),
               "--dataset_name", str(pairs), "--output_dir", str(out / "models" / variant), "--seed", str(seed)]
        if size.max_steps:
            cmd += ["--max_steps", str(size.max_steps)]
        work = json.loads((pairs / "stats.json").read_text())["pairs"]  # steps per epoch, up to a constant
        trainings.append((work if not size.max_steps else 1, (cmd, logs / f"train-{variant}.log",
                          f"{variant}: LoRA training (accelerate launch -m real.train, {recipes[variant].name}; "
                          f"{lanes} at once, {threads} thread{'s' * (threads > 1)} each)")))
    # Longest first: a lane that frees up takes the next training, so the long ones never run alone at the end
    # (five trainings on two lanes; the adapters do not depend on the order, each is its own process).
    trainings.sort(key=lambda t: -t[0])
    run_stages([stage for _, stage in trainings], env, lanes=lanes, t0=t0)
    if size.on_policy:  # it starts from real_sufficient's adapter: after the others, on every core
        cmd = [accelerate, "launch", "--config_file", str(accelerate_cfg), "--num_cpu_threads_per_process",
               str(lanes * threads), "-m", "real.train", "--config", str(recipes[ON_POLICY]),
               "--model_name_or_path", str(base), "--dataset_name", str(out / "data" / f"pairs-{ON_POLICY_START}"),
               "--records", str(enhanced_path), "--init_adapter", str(out / "models" / ON_POLICY_START),
               "--output_dir", str(out / "models" / ON_POLICY), "--seed", str(seed)]
        steps = size.on_policy_steps or (min(size.max_steps, 20) if size.max_steps else None)
        if steps:
            cmd += ["--max_steps", str(steps)]
        run_stages([(cmd, logs / f"train-{ON_POLICY}.log",
                     f"{ON_POLICY}: GRPO from {ON_POLICY_START}'s adapter, rewarded by its own ablations "
                     f"(accelerate launch -m real.train, {recipes[ON_POLICY].name})")], env, t0=t0)


def _run_demo_locked(out: Path, base: Path, size: DemoSize, seed: int, accelerate_cfg: Path,
                     recipes: dict[str, Path], t0: float) -> dict:
    logs = out / "logs"
    logs.mkdir(exist_ok=True)

    _stage(f"world: {size.n_train} train / {size.n_test} test claims (seed {seed})", t0)
    train_path, test_path = write_world_records(out, size, seed)
    enhanced_path, enhancement = enhance_step(out, train_path, seed, t0)

    train_variants(out, base, size, seed, enhanced_path, accelerate_cfg, recipes, t0)
    variants = demo_variants(size)

    for variant in variants:
        _stage(f"{variant}: fae run (R = 4) on the test split", t0)
        run_dir = out / "runs" / variant
        _call(fae_run, FaeRunConfig(records=test_path, output=run_dir, backend="hf", model=base,
                                       adapter=out / "models" / variant, rounds=4, batch_size=32,
                                       max_new_tokens=16, progress=False, dtype=DEMO_DTYPE,
                                       chunk_size=256))  # all test claims in one window: the measured batches
        _stage(f"{variant}: fae probe (DirK; h(K) from the variant, then from the base model)", t0)
        for reference, probe_dir in (("verifier", variant), ("base", base_reference_dir(variant))):
            _call(fae_probe, ProbeConfig(run_dir=run_dir, model=base, adapter=out / "models" / variant,
                                         output=out / "probes" / probe_dir, bootstrap=size.bootstrap, seed=seed,
                                         batch_size=32, knowledge_reference=reference, dtype=DEMO_DTYPE))

    _stage("reports: fae report, fae probe-report, fae compare (sft vs real)", t0)
    runs = [str(out / "runs" / v) for v in variants]
    _call(fae_report, ReportConfig(runs=runs, output=out, names=list(variants)))
    _call(fae_probe_report, ProbeReportConfig(dirs=[out / "probes" / v for v in variants], output=out,
                                              names=list(variants)))
    _append(out / "report.md", dirk_lines(out, variants))
    _call(fae_compare, CompareConfig(run_a=out / "runs" / "sft", run_b=out / "runs" / "real",
                                     output=out / "compare", metric="strict", bootstrap=size.bootstrap, seed=seed))

    test = load_records(test_path)
    incomplete = {r.id for r in test if r.extra.get("incomplete_gold")}
    subsets = {"incomplete": {v: subset_metrics(out / "runs" / v, incomplete) for v in variants},
               "complete": {v: subset_metrics(out / "runs" / v, {r.id for r in test} - incomplete)
                            for v in variants}}
    _append(out / "report.md", enhancement_lines(enhancement) + subset_lines(subsets))

    pave = _pave_step(out, base, test_path, size, seed, t0) if size.pave_claims else {}

    _stage(f"fae view: per-claim explorer of the {len(variants)} runs (view/index.html)", t0)
    _call(fae_view, ViewConfig(runs=runs, output=out / "view", names=list(variants), title="real-demo: FAE claims"))

    summary = {
        "wall_seconds": round(time.time() - t0, 1),
        "size": {**asdict(size), "seed": seed},
        "dtype": DEMO_DTYPE,  # every model call of the demo, training and evaluation alike
        "cpu_family": cpu_family(),
        "cpu": cpu_model_name(),
        "variants": {v: json.loads((out / "runs" / v / "metrics.json").read_text()) for v in variants},
        "incomplete_gold": subsets,
        "enhancement": enhancement,
        "pave": pave,
    }
    atomic_write_json(out / "summary.json", summary)
    reference, same_family = reference_for(summary["cpu_family"], REFERENCE_DIR)
    drift = drift_report(summary, reference, same_family=same_family, family=summary["cpu_family"])
    atomic_write_json(out / "drift.json", drift)
    _stage("done", t0)
    print()
    print((out / "report.md").read_text())
    print(soft_lines(summary["variants"]))
    print("\n".join(drift_lines(drift)))
    return summary


def soft_lines(variants: dict[str, dict]) -> str:
    """Soft FAE per variant (x100): how confidently each verifier abstains once evidence is gone."""
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.2f}"

    lines = ["soft FAE (x100; figures: soft_trajectory.png, reliability.png):"]
    for name, m in variants.items():
        soft = m.get("soft") or {}
        curve = " / ".join(pct(x) for x in soft.get("p_nei") or [])
        lines.append(f"  {name:>14}: soft IS {pct(soft.get('soft_IS'))}, NEI area {pct(soft.get('nei_area'))}, "
                     f"round-0 ECE {pct(soft.get('ece'))}, P(NEI) by round {curve or 'n/a'}")
    return "\n".join(lines)
