"""Small records and hand-built FAE run directories for the probe tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from real_fae_core.hashing import sha256_file

CLAIMS = [
    ("The vaccine reduces the risk of severe disease.", "SUPPORT"),
    ("The study found a significant effect of the treatment.", "REFUTE"),
    ("Results were consistent across trials in 2020.", "SUPPORT"),
    ("The sky is green during the day.", "REFUTE"),
    ("Grass is green.", "SUPPORT"),
    ("Patients with COVID-19 recovered faster.", "REFUTE"),
]
SENTS = [
    "The vaccine reduced severe disease in all cohorts.",
    "Grass is green.",
    "The study found no significant effect of the treatment.",
    "Results were consistent across trials, cohorts and populations.",
    "Rayleigh scattering colours the sky blue.",
    "Cutting Knowledge Date: December 2023.",
    "Patients recovered at the same rate.",
]


def make_records(n: int = 4, *, nei: int = 0) -> list[dict]:
    """``n`` SUPPORT/REFUTE records of varying pool size (+ ``nei`` NEI ones)."""
    recs = []
    for i in range(n + nei):
        claim, label = CLAIMS[i % len(CLAIMS)]
        k = 3 + i % 4  # pool sizes 3..6 -> prompts of different lengths
        ids = [2 * j + (i % 2) for j in range(k)]  # non-contiguous ids
        sents = [{"id": sid, "text": SENTS[(i + j) % len(SENTS)], "doc": f"D{i}"}
                 for j, sid in enumerate(ids)]
        if i >= n:
            recs.append({"id": f"c{i}", "dataset": "toy", "claim": claim,
                         "label": "NOT_ENOUGH_INFO", "sentences": sents, "evidence": []})
        else:
            recs.append({"id": f"c{i}", "dataset": "toy", "claim": claim, "label": label,
                         "sentences": sents, "evidence": [[ids[0]], [ids[1], ids[2]]]})
    return recs


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def make_run_dir(run_dir: Path, records_path: Path, records: list[dict], *, rounds: int = 3,
                 silent: tuple[str, ...] = (), model: str = "tiny") -> Path:
    """A hand-built FAE run following the run contract (claims.jsonl + config.json).

    Each round the "verifier" cites the first two ids still in the pool, so
    ``S^{r+1} = S^r \\ E(r)``; claims in ``silent`` cite nothing, so their pool
    never changes (DirK undefined for every round).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for rec in records:
        pool = [s["id"] for s in rec["sentences"]]
        entries = []
        for r in range(rounds + 1):
            cited = [] if rec["id"] in silent else pool[:2]
            label = rec["label"] if cited else "NOT_ENOUGH_INFO"
            entries.append({
                "round": r, "pool_ids": list(pool),
                "raw_output": json.dumps({"label": label, "evidence": cited}),
                "label": label, "cited": cited, "hallucinated": [], "valid": True,
                "reused": False,
            })
            pool = [i for i in pool if i not in cited]
        rows.append({"id": rec["id"], "gold_label": rec["label"], "gold_groups": rec["evidence"],
                     "rounds": entries})
    write_jsonl(run_dir / "claims.jsonl", rows)
    (run_dir / "config.json").write_text(json.dumps({
        "records": str(records_path), "records_sha256": sha256_file(records_path),
        "model": model, "adapter": None, "rounds": rounds,
    }))
    from fae_helpers import seal_run

    return seal_run(run_dir)


def make_lora_adapter(model_path: Path, out: Path, targets=("q_proj", "v_proj"), seed: int = 1) -> Path:
    """A LoRA adapter with non-zero B (so it changes the states), saved with PEFT."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), init_lora_weights=False,
                     task_type="CAUSAL_LM")
    peft_model = get_peft_model(base, cfg)
    peft_model.save_pretrained(out)
    return out


def with_nonzero_pad(model_path: Path, out: Path, seed: int = 0) -> Path:
    """Copy of a tiny model whose pad-token embedding is random, not zero.

    ``from_config`` zeroes the ``padding_idx`` row, so padding would be
    invisible even without masking; real checkpoints have a non-zero row.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if out.exists():
        return out
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        emb[tok.pad_token_id] = torch.randn(emb.shape[1], generator=g) * emb.std()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_tiny_gemma3(out: Path) -> Path:
    """A random 2-layer Gemma3ForCausalLM with the real Gemma-3 chat template (TRL's copy).

    Sliding-window attention (window 16, shorter than the prompts) is on, so
    left padding meets the local-attention mask too.
    """
    from importlib import resources

    import torch
    from tiny_models import build_tokenizer
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    if out.exists():
        return out
    tok = build_tokenizer("qwen2")
    tok.add_special_tokens({"bos_token": "<bos>",
                            "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tok.eos_token = "<end_of_turn>"
    tok.chat_template = resources.files("trl").joinpath("chat_templates", "gemma3.jinja").read_text()
    cfg = Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        sliding_window=16, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_gemma3(tmp_path_factory) -> Path:
    """Fixture: :func:`build_tiny_gemma3` once per session (import it into a test module)."""
    return build_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3") / "m")
