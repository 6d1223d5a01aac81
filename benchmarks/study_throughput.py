"""The study's answers per second (SPEC §10, `fae study`): one request at a time, batched, and prefix-shared.

    python benchmarks/study_throughput.py --pools pools/scifact-dev --model MODEL \
        --output benchmarks/results/study_throughput.json [--units 6] [--dtype auto]

The paper asks its grid one request at a time. Every primary prompt of a unit (sources x budgets x
formats x greedy + five seeds: 48 with two sources and two budgets) repeats most of the others' tokens,
so the same prompts are answered four ways, in one run, on one model and dtype:

- ``one_at_a_time``: each prompt alone, ``generate`` at batch 1 (the paper's loop);
- ``batched``: all prompts in left-padded batches of ``--batch-size`` across units, each row from its own
  seed (:func:`fae.backends.hf.generate_batched`, what `fae study` did before the prefix tree);
- ``shared``: the prefix tree (:meth:`fae.backends.hf.HFBackend.generate_rows`): chunks of
  ``--chunk-size`` prompts in the grid's order, each shared prefix read once
  (:mod:`fae.backends.prefix_tree`), each decoding step transformers' forward;
- ``shared_lean_step``: the same with the lean decoding step (:mod:`fae.backends.decode_step`), what
  `fae study` does now on a Llama-family model.

For each: wall seconds, responses per second, the ratio to one at a time, the prompt tokens prefilled,
and how many answers equal one at a time's to the character (the paths group the arithmetic
differently, which can move a logit in its last bits; greedy and seeded answers are otherwise the same).
The units are the first ``--units`` of the pools in the order of a hash of their ids (whole claims).
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from pathlib import Path

from real_fae_core.atomicio import atomic_write_json
from real_fae_core.hardware import cpu_model_name
from real_fae_core.hashing import derived_seed
from data_prep.prompts import encode_chat
from fae.backends.decode_step import decode_step_for
from fae.backends.hf import generate_batched, greedy_config, load_hf_model, resolve_dtype
from fae.backends.prefix_tree import generate_shared
from fae.study.grid import load_pools, primary_conditions
from fae.study.interfaces import ANSWER_TOKENS, FORMATS
from fae.study.replicates import SamplingParams, replicate_plan
from fae.study.asking import Asker


def study_prompts(pools_dir: str, n_units: int):
    """(chat prompts, decodings, unit count, claims) of the primary grid of ``n_units`` hash-chosen units."""
    pools = load_pools(pools_dir)
    claims = sorted({u.claim_id for u in pools.units}, key=lambda c: (derived_seed("throughput", c), c))
    chosen, units = set(), []
    for c in claims:
        if len(units) >= n_units:
            break
        chosen.add(c)
        units += [u for u in pools.units if u.claim_id == c]
    params = SamplingParams()
    replicates = {r.index: r for r in replicate_plan(params)}
    asker = Asker(pools.dataset, {u.id: u for u in units}, replicates, params)
    conditions = [c for u in units for c in primary_conditions(u, list(range(pools.n_sources)), pools.budgets,
                                                             list(FORMATS), sorted(replicates))]
    prompts = [asker.prompt(c)[0] for c in conditions]
    return prompts, [asker.decoding(c) for c in conditions], pools, len(units), len(chosen)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def measure(lm, tok, prompts, decodings, args) -> dict:
    ids = [encode_chat(tok, m) for m in prompts]
    configs: dict = {}

    def gc(cap):
        return configs.setdefault(cap, greedy_config(lm, tok, cap))

    caps = [d.max_new_tokens or ANSWER_TOKENS for d in decodings]
    generate_batched(lm, tok, ids[:1], gc(caps[0]), 1, sampling=decodings[:1])  # warm-up, not timed

    def one_at_a_time():
        return [generate_batched(lm, tok, [x], gc(c), 1, sampling=[d])[0] for x, c, d in zip(ids, caps, decodings)]

    def batched():
        out = [None] * len(ids)
        for cap in sorted(set(caps)):
            members = [i for i, c in enumerate(caps) if c == cap]
            got = generate_batched(lm, tok, [ids[i] for i in members], gc(cap), args.batch_size,
                                   sampling=[decodings[i] for i in members])
            for i, g in zip(members, got):
                out[i] = g
        return out

    read = {"shared": 0, "shared_lean_step": 0}
    lean = decode_step_for(lm)

    def shared(step=None, key="shared"):
        out = []
        read[key] = 0
        for start in range(0, len(ids), args.chunk_size):
            got, counts = generate_shared(lm, tok, ids[start:start + args.chunk_size],
                                          decodings[start:start + args.chunk_size], gc, ANSWER_TOKENS, step=step)
            out += got
            read[key] += counts["prefill_tokens"]
        return out

    rows = {}
    baseline, base_s = timed(one_at_a_time)
    prompt_tokens = sum(map(len, ids))
    paths = (("one_at_a_time", None), ("batched", batched), ("shared", shared),
             ("shared_lean_step", lambda: shared(lean, "shared_lean_step")))
    for name, fn in paths:
        got, secs = (baseline, base_s) if fn is None else timed(fn)
        rows[name] = {"seconds": round(secs, 2), "responses_per_s": round(len(ids) / secs, 3),
                      "ratio_to_one_at_a_time": round(base_s / secs, 2),
                      "prefill_tokens": read.get(name, prompt_tokens),
                      "same_answers_as_one_at_a_time": sum(a.text == b.text for a, b in zip(got, baseline)),
                      "invalid_or_cut": sum(g.finish_reason == "length" for g in got)}
        print(f"{name}: {rows[name]}", file=sys.stderr)
    return {"prompts": len(ids), "prompt_tokens": prompt_tokens,
            "mean_prompt_tokens": round(prompt_tokens / len(ids), 1),
            "distinct_prompts": len({tuple(x) for x in ids}), "paths": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--pools", action="append", required=True, help="a `real-data retrieve` directory (repeat)")
    p.add_argument("--model", required=True)
    p.add_argument("--units", type=int, nargs="+", default=[6],
                   help="units per pools directory, one number or one per --pools (whole claims, hash order)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-size", type=int, default=8, help="the batched path's batch (fae study's default)")
    p.add_argument("--chunk-size", type=int, default=64, help="the shared path's chunk (fae study's default)")
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    import torch
    import transformers

    lm, tok = load_hf_model(args.model, None, args.dtype, "cpu")
    result = {"benchmark": "study_throughput", "command": shlex.join(["python", "benchmarks/study_throughput.py",
                                                                      *sys.argv[1:]]),
              "model": Path(args.model).name, "dtype": str(resolve_dtype(args.dtype, "cpu")).replace("torch.", ""),
              "torch": torch.__version__, "transformers": transformers.__version__,
              "threads": torch.get_num_threads(), "cpu": cpu_model_name(), "machine": platform.machine(),
              "batch_size": args.batch_size, "chunk_size": args.chunk_size, "answer_cap": ANSWER_TOKENS, "sets": {}}
    if len(args.units) not in (1, len(args.pools)):
        p.error(f"--units: one number or one per --pools ({len(args.pools)})")
    for pools_dir, units in zip(args.pools, args.units * len(args.pools) if len(args.units) == 1 else args.units):
        prompts, decodings, pools, n_units, n_claims = study_prompts(pools_dir, units)
        print(f"{pools.dataset}: {n_units} units of {n_claims} claims, {len(prompts)} prompts", file=sys.stderr)
        result["sets"][pools.dataset] = {"units": n_units, "claims": n_claims, "sources": pools.n_sources,
                                         "budgets": pools.budgets, **measure(lm, tok, prompts, decodings, args)}
    atomic_write_json(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
