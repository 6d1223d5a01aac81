"""What soft FAE's label probabilities cost on the hf backend (``--no-label-probs`` turns them off).

Times ``fae.backends.hf.generate_batched`` on the same round-0 prompts with and
without the teacher-forced label probabilities (one prompt pass kept as KV
cache + one pass over the three label continuations per batch), alternating
the two ``--repeats`` times, and checks that the answers are identical.

    python benchmarks/soft_fae_overhead.py                   # the demo base model, 200 demo test claims
    python benchmarks/soft_fae_overhead.py --model PATH --max-new-tokens 64

It prints both timings (best of the repeats), their ratio and the identical-answer
count; no run of it is committed, so docs/fae.md ("Soft FAE") quotes no timing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    from data_prep.prompts import encode_chat, render_evidence_prompt
    from data_prep.records import load_records
    from fae.backends.hf import generate_batched, greedy_config, load_hf_model
    from real.demo.pipeline import BASE_DIR, DemoSize, write_world_records

    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(BASE_DIR))
    ap.add_argument("--claims", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import torch

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        _, test = write_world_records(Path(tmp), DemoSize(n_train=40, n_test=args.claims), seed=0)
        records = load_records(test)
    lm, tok = load_hf_model(args.model, device="cpu")
    gc = greedy_config(lm, tok, args.max_new_tokens)
    ids = [encode_chat(tok, render_evidence_prompt(r, r.pool_ids)) for r in records]
    times: dict[bool, list[float]] = {False: [], True: []}
    answers: dict[bool, list[str]] = {}
    for _ in range(args.repeats):
        for soft in (False, True):
            t = time.perf_counter()
            out = generate_batched(lm, tok, ids, gc, args.batch_size, label_probs=soft)
            times[soft].append(time.perf_counter() - t)
            answers[soft] = [g.text for g in out]
    off, on = min(times[False]), min(times[True])
    same = sum(a == b for a, b in zip(answers[False], answers[True]))
    print(f"{len(ids)} prompts, batch {args.batch_size}, max_new_tokens {args.max_new_tokens}: "
          f"without label probs {off:.2f} s, with {on:.2f} s (best of {args.repeats}): "
          f"overhead {100 * (on / off - 1):.0f}%; identical answers {same}/{len(ids)}")


if __name__ == "__main__":
    main()
