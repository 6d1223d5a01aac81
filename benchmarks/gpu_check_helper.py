"""Child-process helpers of ``benchmarks/gpu_check.py`` (run as a script, never imported by the library).

Each job runs in its own process so the check's parent never holds a CUDA
context or a model, and one crashing job cannot take the others down::

    python benchmarks/gpu_check_helper.py build-llama --shape 8b --out DIR [--device cuda] [--dtype bfloat16]
    python benchmarks/gpu_check_helper.py fae-run --timing T.json -- run --records R --output O --backend hf ...

``build-llama`` saves a random Llama of a given shape (built in code, no
download) with the framework's tiny BPE tokenizer and the real Llama-3.1 chat
template, and writes ``shape.json`` (dimensions, parameter counts).
``fae-run`` is the real ``fae run`` (``fae.cli.main``) with the backend's
batched generation timed (CUDA-synchronised) and its prompt tokens counted,
so prefill throughput excludes model loading; timings go to ``--timing``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# The tiny word tokenizer with the real chat template is a test-only builder (tests/tiny_models.py);
# gpu_check.py runs this helper in a full copy of the repository, so tests/ is there.
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

# Llama shapes: "1b" is Llama-3.2-1B's body, "8b" is Llama-3.1-8B's body (vocabulary: the tiny
# tokenizer's, ~600 tokens, so generated ids always decode); "tiny" is for the CPU dry run.
SHAPES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=8192, rope_theta=500000.0),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, rope_theta=500000.0),
}


def linear_params(shape: dict) -> int:
    """Weights of the transformer body's matmuls (q, k, v, o, gate, up, down), the N of 2·N FLOPs/token."""
    d, layers, inter = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"]
    kv = d // shape["num_attention_heads"] * shape["num_key_value_heads"]
    return layers * (2 * d * d + 2 * d * kv + 3 * d * inter)


def build_llama(out: Path, shape_name: str, device: str = "auto", dtype: str = "auto", seed: int = 0) -> dict:
    import torch
    from tiny_models import build_tokenizer
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    shape = SHAPES[shape_name]
    tok = build_tokenizer("llama")
    config = LlamaConfig(vocab_size=len(tok), max_position_embeddings=8192, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         tie_word_embeddings=False, **shape)
    torch.manual_seed(seed)
    t0 = time.time()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    eos = [tok.convert_tokens_to_ids("<|eot_id|>"), tok.convert_tokens_to_ids("<|end_of_text|>")]
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=tok.pad_token_id, do_sample=False)
    built = time.time() - t0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    info = {
        "shape": shape_name, **shape, "vocab_size": len(tok), "dtype": dtype, "device": device,
        "parameters": sum(p.numel() for p in model.parameters()),
        "linear_parameters": linear_params(shape),
        "build_seconds": round(built, 2), "save_seconds": round(time.time() - t0 - built, 2),
    }
    (out / "shape.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_fae_run(timing_path: Path, fae_argv: list[str]) -> int:
    """``fae run`` with every generate batch timed; writes the per-batch records to ``timing_path``."""
    import fae.backends.hf as hf
    from fae.cli import main as fae_main

    batches: list[dict] = []
    real_generate = hf.generate_batched

    def generate_batched(lm, tok, token_ids, gc, batch_size, callback=None, **kwargs):  # kwargs: label_probs
        order = sorted(range(len(token_ids)), key=lambda i: -len(token_ids[i]))
        out: list[str] = [""] * len(token_ids)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            chunk = [token_ids[i] for i in idx]
            _sync()
            t0 = time.perf_counter()
            texts = real_generate(lm, tok, chunk, gc, batch_size, **kwargs)
            _sync()
            batches.append({"prompts": len(chunk), "tokens": sum(map(len, chunk)),
                            "padded_tokens": len(chunk) * max(map(len, chunk)),
                            "seconds": time.perf_counter() - t0})
            for i, t in zip(idx, texts):
                out[i] = t
            if callback:
                callback(len(idx))
        return out

    hf.generate_batched = generate_batched
    vllm_calls = _time_vllm(batches)
    t0 = time.time()
    try:
        rc = fae_main(fae_argv)
    finally:
        timing_path.write_text(json.dumps({"wall_seconds": time.time() - t0, "batches": batches,
                                           "vllm_timed": vllm_calls}, indent=2) + "\n")
    return rc


def _time_vllm(batches: list[dict]) -> bool:
    """Time the vLLM backend's generate calls too, when vLLM is there (one record per call)."""
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    from data_prep.prompts import encode_chat
    from fae.backends import vllm_backend

    real = vllm_backend.VLLMBackend.generate

    def generate(self, prompts, callback=None):
        tokens = sum(len(encode_chat(self.tok, m)) for m in prompts)
        t0 = time.perf_counter()
        texts = real(self, prompts, callback=callback)
        batches.append({"prompts": len(prompts), "tokens": tokens, "padded_tokens": tokens,
                        "seconds": time.perf_counter() - t0})
        return texts

    vllm_backend.VLLMBackend.generate = generate
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="gpu_check_helper")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-llama", allow_abbrev=False)
    b.add_argument("--shape", choices=sorted(SHAPES), required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--device", default="auto")
    b.add_argument("--dtype", default="auto")
    r = sub.add_parser("fae-run", allow_abbrev=False)
    r.add_argument("--timing", required=True)
    r.add_argument("fae_argv", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.cmd == "build-llama":
        print(json.dumps(build_llama(Path(args.out), args.shape, args.device, args.dtype)))
        return 0
    fae_argv = args.fae_argv[1:] if args.fae_argv[:1] == ["--"] else args.fae_argv
    return timed_fae_run(Path(args.timing), fae_argv)


if __name__ == "__main__":
    raise SystemExit(main())
