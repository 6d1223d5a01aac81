"""Our engine beside llama.cpp, the engine a CPU user would pick instead: the same GGUF, the same prompts,
greedy both, on this machine, in one run.

    pip install "llama-cpp-python[server]==0.3.36"      # builds llama.cpp from source (~5 min on 2 cores)
    real-import-gguf verifier-q4_1.gguf --output models/verifier   # the same weights for transformers
    python benchmarks/llama_cpp_peer.py --gguf verifier-q4_1.gguf --model models/verifier \\
        --records data/check-covid-test.jsonl --claims 100 --output benchmarks/results/llama_cpp_peer.json

Two comparisons:

1. Per request, batch 1 (``--phase-prompts`` Check-COVID prompts, the same token ids both sides): llama.cpp
   through its Python binding (``Llama.generate``, greedy, no repetition penalty; its own timers split
   prefill from decoding) against our transformers model with the lean decoding step, bf16 weights and
   ``--weights int4`` (PyTorch's int4 kernel, groups of 32 with a scale and a zero point like Q4_1):
   prefill tokens/s, decoding ms per token, and the share of identical answers.
2. FAE end to end on ``--claims`` claims, R rounds: ``fae run --backend openai`` against llama.cpp's own
   OpenAI-compatible server (``python -m llama_cpp.server``, one model, ``--threads`` threads) and
   ``fae run --backend hf`` with its defaults, with ``--weights int8`` and ``int4``, and at the other
   ``--batch-sizes`` (bf16): claims per second (wall clock
   of the command, model load included) and the share of claim-rounds whose answer is the server's.
   llama.cpp's server samples with a repetition penalty of 1.1 unless the request says otherwise, which
   ``fae run`` does not: the server here starts with that default set to 1.0, our side's greedy setting.
   Label probabilities are off on every side (``--no-label-probs``): the server's logprobs are another
   request path.

Weights: llama.cpp reads the GGUF's blocks (Q8_0: 8.5 bits a weight; Q4_1: 4.5); transformers reads the
same values dequantized into bf16 (2 bytes a weight), or requantized by ``--weights int8`` (a scale per
output row) or ``int4`` (groups of 32). A LoRA-tuned verifier quantized to Q4_1 loses its tuning (its
deltas are below the 4-bit grid: SmolLM2's SFT verifier answered prose again), so the verifier's GGUF is
Q8_0; the batch-1 decode comparison at 4 bits runs on the base model's Q4_1 GGUF with ``--claims 0``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep.prompts import encode_chat, render_evidence_prompt  # noqa: E402
from data_prep.records import load_records  # noqa: E402
from fae.backends.hf import HFOptions  # noqa: E402
from real_fae_core.hardware import cpu_model_name  # noqa: E402

SERVED_NAME = "verifier"
# Run in the server's process: greedy as fae run asks for it (temperature 0) with no repetition penalty.
SERVER_SNIPPET = """
import sys
import llama_cpp.server.types as types
for model in (types.CreateCompletionRequest, types.CreateChatCompletionRequest):
    model.model_fields["repeat_penalty"].default = 1.0
    model.model_rebuild(force=True)
from llama_cpp.server.__main__ import main
sys.argv = ["llama_cpp.server"] + sys.argv[1:]
main()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_cpp_requests(gguf: str, prompts: list[list[int]], cap: int, eos: set[int], threads: int) -> dict:
    """Greedy answers of llama.cpp (Python binding) for token-id prompts, one at a time, and its phase timers."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=gguf, n_ctx=4096, n_batch=512, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    answers, prefill_ms, prefill_tokens, decode_ms, decode_tokens = [], 0.0, 0, 0.0, 0
    for ids in prompts:
        llm.reset()
        llama_cpp.llama_perf_context_reset(llm.ctx)
        out = []
        for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if token in eos or len(out) >= cap:
                break
        perf = llama_cpp.llama_perf_context(llm.ctx)
        prefill_ms += perf.t_p_eval_ms
        prefill_tokens += perf.n_p_eval
        decode_ms += perf.t_eval_ms
        decode_tokens += perf.n_eval
        answers.append(out)
    return {"answers": answers, "prefill_tokens_per_s": prefill_tokens / (prefill_ms / 1e3),
            "decode_ms_per_token": decode_ms / max(decode_tokens, 1), "prefill_tokens": prefill_tokens,
            "decoded_tokens": decode_tokens, "llama_cpp_python": llama_cpp.__version__}


def our_requests(lm, step, prompts: list[list[int]], cap: int, eos: set[int]) -> dict:
    """The same prompts one at a time through transformers' prefill and ``step``; both phases timed."""
    import torch

    from fae.backends.reserved_cache import cache_kwarg, reserved_cache

    answers, prefill_s, decode_s, decoded = [], 0.0, 0.0, 0
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            cache = reserved_cache(lm, cap + 1)
            t = time.perf_counter()
            logits = lm(input_ids=x, use_cache=True, logits_to_keep=1, **{cache_kwarg(lm): cache}).logits[:, -1].float()
            prefill_s += time.perf_counter() - t
            out = [int(logits.argmax())]
            t = time.perf_counter()
            mask = torch.ones(1, len(ids) + 1, dtype=torch.long)
            while out[-1] not in eos and len(out) < cap:
                logits = step(torch.tensor([[out[-1]]]), mask, torch.tensor([[len(ids) + len(out) - 1]]), cache)
                out.append(int(logits.argmax()))
                mask = torch.cat([mask, mask.new_ones(1, 1)], dim=1)
            decode_s += time.perf_counter() - t
            decoded += len(out) - 1
            answers.append(out)
    tokens = sum(map(len, prompts))
    return {"answers": answers, "prefill_tokens_per_s": tokens / prefill_s,
            "decode_ms_per_token": decode_s / max(decoded, 1) * 1e3, "prefill_tokens": tokens,
            "decoded_tokens": decoded}


def phases(args, eos: set[int]) -> dict:
    from fae.backends.decode_step import LeanLlamaStep
    from fae.backends.hf import load_hf_model

    lm, tok = load_hf_model(args.model, dtype="bf16", device="cpu")
    prompts = [encode_chat(tok, render_evidence_prompt(r)) for r in load_records(args.records)[:args.phase_prompts]]
    peer = llama_cpp_requests(args.gguf, prompts, args.max_new_tokens, eos, args.threads)
    out = {"prompts": len(prompts), f"llama.cpp ({gguf_type(args.gguf)} GGUF)": peer}
    for weights in args.weights:
        name = "ours, lean step (bf16)" if weights == "model" else f"ours, lean step (--weights {weights})"
        mine = our_requests(lm, LeanLlamaStep(lm, weights), prompts, args.max_new_tokens, eos)
        mine["identical_answers_to_llama_cpp"] = sum(a == b for a, b in zip(mine["answers"], peer["answers"]))
        out[name] = mine
    for side in out.values():
        if isinstance(side, dict):
            side["answers"] = [tok.decode(a, skip_special_tokens=True) for a in side.pop("answers")]
    return out


def gguf_type(path: str) -> str:
    """The GGUF's most common tensor type (Q4_1, Q8_0 ...)."""
    from collections import Counter

    import gguf

    return Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors).most_common(1)[0][0]


def fae_run(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(["fae", "run", *argv], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def answers_of(run_dir: Path) -> dict:
    """(claim id, round) -> the raw answer, for every round the run asked the model (reused rounds too)."""
    out = {}
    with open(run_dir / "claims.jsonl") as fh:
        for line in fh:
            claim = json.loads(line)
            for r in claim["rounds"]:
                out[(claim["id"], r["round"])] = r["raw_output"]
    return out


def start_server(gguf: str, threads: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SNIPPET, "--model", gguf, "--model_alias", SERVED_NAME,
                             "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", "4096",
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/models", timeout=2).read()
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"llama.cpp's server exited ({proc.returncode}); see {log}")
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"llama.cpp's server did not answer in 300 s; see {log}")


def end_to_end(args) -> dict:
    work = args.work
    common = ["--records", args.records, "--limit", str(args.claims), "--rounds", str(args.rounds),
              "--max-new-tokens", str(args.max_new_tokens), "--no-label-probs", "--no-progress"]
    proc, url = start_server(args.gguf, args.threads, work / "server.log")
    try:
        peer_s = fae_run(common + ["--output", str(work / "llama-cpp-server"), "--backend", "openai",
                                   "--base-url", url, "--model", SERVED_NAME, "--concurrency", "1"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    runs = {"llama.cpp server, fae run --backend openai": (peer_s, work / "llama-cpp-server")}
    hf_runs = [(w, args.batch_sizes[0]) for w in args.weights] + [("model", b) for b in args.batch_sizes[1:]]
    for weights, batch in hf_runs:
        name = "fae run --backend hf" + (f" --weights {weights}" if weights != "model" else " (bf16)") + \
            (f" --batch-size {batch}" if batch != args.batch_sizes[0] else "")
        out = work / f"hf-{weights}-{batch}"
        runs[name] = (fae_run(common + ["--output", str(out), "--backend", "hf", "--model", args.model,
                                        "--weights", weights, "--batch-size", str(batch)]), out)
    peer_answers = answers_of(work / "llama-cpp-server")
    result = {}
    for name, (seconds, run_dir) in runs.items():
        mine = answers_of(run_dir)
        same = sum(mine.get(k) == v for k, v in peer_answers.items())
        result[name] = {"seconds": seconds, "claims_per_s": args.claims / seconds,
                        "speed_vs_llama_cpp_server": peer_s / seconds,
                        "claim_rounds": len(mine), "identical_to_llama_cpp_server": same}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--gguf", required=True, help="the GGUF llama.cpp reads")
    p.add_argument("--model", required=True, help="the same GGUF imported by real-import-gguf")
    p.add_argument("--records", required=True, help="converted Check-COVID records")
    p.add_argument("--claims", type=int, default=100, help="FAE claims end to end (0: the per-request part only)")
    p.add_argument("--weights", nargs="+", default=["model", "int8", "int4"], choices=["model", "int8", "int4"],
                   help="our decode-step weights to compare")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[HFOptions.batch_size],
                   help="fae run --batch-size: the first for every --weights, the others for bf16 only")
    p.add_argument("--phase-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--work", type=Path, required=True, help="a directory for the runs (created)")
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    import torch
    import transformers
    from transformers import GenerationConfig

    gen = GenerationConfig.from_pretrained(args.model)
    eos = set(gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id])
    result = {"machine": {"cpu": cpu_model_name(), "threads": args.threads, "python": platform.python_version(),
                          "torch": torch.__version__, "transformers": transformers.__version__},
              "gguf": Path(args.gguf).name, "claims": args.claims, "rounds": args.rounds,
              "max_new_tokens": args.max_new_tokens}
    t = time.perf_counter()
    result["per_request"] = phases(args, eos)
    result["per_request_seconds"] = time.perf_counter() - t
    result["fae_end_to_end"] = end_to_end(args) if args.claims else {}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


def table(r: dict) -> str:
    lines = ["| per request, batch 1 | prefill tokens/s | decode ms/token | answers = llama.cpp's |", "|---|---|---|---|"]
    pr = r["per_request"]
    for name, side in pr.items():
        if isinstance(side, dict):
            same = side.get("identical_answers_to_llama_cpp")
            share = "-" if same is None else f"{same}/{pr['prompts']}"
            lines.append(f"| {name} | {side['prefill_tokens_per_s']:.0f} | {side['decode_ms_per_token']:.1f} | "
                         f"{share} |")
    if not r["fae_end_to_end"]:
        return "\n".join(lines)
    lines += ["", f"| FAE, {r['claims']} claims, R = {r['rounds']} | seconds | claims/s | x llama.cpp server | "
              "claim-rounds = server's |", "|---|---|---|---|---|"]
    for name, run in r["fae_end_to_end"].items():
        lines.append(f"| {name} | {run['seconds']:.1f} | {run['claims_per_s']:.2f} | "
                     f"{run['speed_vs_llama_cpp_server']:.2f}x | {run['identical_to_llama_cpp_server']}/"
                     f"{run['claim_rounds']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
