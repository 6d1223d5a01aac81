"""PAVE's ``samples.jsonl``: sampled answers per claim and condition, appended chunk by chunk.

Rerunning the same command resumes: finished claims are read back (a line cut
by a kill is dropped) and only the rest is sampled.
"""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.core.errors import UserError
from data_prep.core.jsonl import read_appended
from data_prep.prompts import parse_answer
from data_prep.records import ClaimRecord, RecordError
from fae.comparison.pave_prompts import prompts_for

SAMPLES = "samples.jsonl"


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
