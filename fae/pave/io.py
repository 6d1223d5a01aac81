"""PAVE's ``samples.jsonl``: sampled answers per claim and condition, appended chunk by chunk.

Rerunning the same command resumes: finished claims are read back (a line cut
by a kill is dropped) and only the rest is sampled. Every prompt is sampled
with its own seed, named by (``--seed``, claim id, condition), so a resumed
run's lines equal an uninterrupted run's (docs/runs.md).

Two sampling settings, as in the paper: the *profile* conditions (states, CR,
PR: ``--samples`` runs at ``--temperature``) and, when the JSD rule's settings
differ (``--jsd-samples`` at ``--jsd-temperature``), the same prompts again
under ``<condition>@jsd``.
"""

from __future__ import annotations

import json
from pathlib import Path

from real_fae_core.errors import UserError
from real_fae_core.jsonl import read_appended
from real_fae_core.progress import progress_bar
from data_prep.prompts import DEFAULT_LINE_IDS, number_lines, parse_shown_answer
from data_prep.records import ClaimRecord, RecordError
from fae.pave.prompts import prompts_for

SAMPLES = "samples.jsonl"
JSD_SUFFIX = "@jsd"


def jsd_condition(cond: str, config) -> str:
    """Where the JSD rule reads a condition's runs: its own ``@jsd`` runs unless the settings are the profile's
    (``config``: the command's :class:`~fae.pave.runner.PaveConfig`)."""
    same = config.jsd_samples == config.samples and config.jsd_temperature == config.temperature
    return cond if same else cond + JSD_SUFFIX


def sampled_conditions(rec: ClaimRecord, config) -> dict[str, tuple[list, list[int], int, float]]:
    """Condition name in samples.jsonl -> (messages, pool ids, runs, temperature)."""
    out = {}
    for cond, (msgs, pool) in prompts_for(rec, getattr(config, "line_ids", DEFAULT_LINE_IDS)).items():
        out[cond] = (msgs, pool, config.samples, config.temperature)
        out[jsd_condition(cond, config)] = (msgs, pool, config.jsd_samples, config.jsd_temperature)
    return out


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


def collect(records: list[ClaimRecord], sampler, config, out_dir: Path) -> list[dict]:
    """Sample every condition of every claim, appending finished claims to samples.jsonl."""
    path = out_dir / SAMPLES
    done = read_samples(path)
    # A claim whose record gained a counterfactual kind since it was sampled is sampled again.
    todo = [r for r in records
            if r.id not in done or not set(sampled_conditions(r, config)) <= set(done[r.id]["conditions"])]
    bar = progress_bar(total=len(records), initial=len(records) - len(todo), desc="pave", unit="claim",
                       enabled=config.progress)
    with path.open("a") as fh:
        for start in range(0, len(todo), config.chunk_size):
            chunk = todo[start:start + config.chunk_size]
            jobs = [(rec, cond, *spec) for rec in chunk for cond, spec in sampled_conditions(rec, config).items()]
            results: dict[int, list] = {}
            for setting in sorted({(j[4], j[5]) for j in jobs}):  # one sampler call per (runs, temperature)
                idx = [i for i, j in enumerate(jobs) if (j[4], j[5]) == setting]
                got = sampler.sample([jobs[i][2] for i in idx], *setting,
                                     keys=[(config.seed, jobs[i][0].id, jobs[i][1]) for i in idx])
                results.update(zip(idx, got))
            lines: dict[str, dict] = {}
            for i, (rec, cond, _msgs, pool, _n, _t) in enumerate(jobs):
                samples = results[i]
                line = lines.setdefault(rec.id, {"id": rec.id, "gold_label": rec.label, "conditions": {}})
                shown = number_lines(pool, getattr(config, "line_ids", DEFAULT_LINE_IDS))
                parsed = [parse_shown_answer(text, shown)[0] for text, _ in samples]
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
