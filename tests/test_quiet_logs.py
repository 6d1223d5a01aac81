"""A command whose stderr is a log file, not a terminal: no ``\\r`` progress bars, none of the third-party
warnings the demo's logs used to repeat (real_fae_core.progress; real_fae_core.tied_embeddings; the one
filter of real_fae_core.entry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import REPO, toy_training_records

from real_fae_core import progress
from real_fae_core.tied_embeddings import untie_for_adapter, untie_for_modules

BIN = Path(sys.executable).parent
# The three warnings of the demo's logs: peft's on attaching an adapter that trains a tied layer, transformers'
# deprecated alias read by peft, peft's on merging such an adapter.
WARNINGS = ("tie_word_embeddings", "ensure_weight_tying", "is_gradient_checkpointing", "no longer tied")
# The children decide for themselves: a variable leaked into this process (a command run in-process sets
# them when pytest's stderr is not a terminal) must not decide for them.
ENV = {k: v for k, v in os.environ.items() if k not in progress.LIBRARY_ENV}
ENV.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
           TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")


def _logged(cmd: list[str], log: Path, timeout: float = 300) -> str:
    """Run ``cmd`` with stdout and stderr into ``log`` (a file, as in the demo's stage logs); its text."""
    with log.open("wb") as fh:
        p = subprocess.run(cmd, cwd=REPO, env=ENV, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                           timeout=timeout)
    text = log.read_bytes().decode("utf-8", "replace")
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{text[-5000:]}"
    return text


def _quiet(text: str) -> None:
    assert "\r" not in text, f"a progress bar in a log: {text[max(0, text.index(chr(13)) - 200):][:400]!r}"
    for w in WARNINGS:
        assert w not in text, f"warning {w!r} in a log:\n{text[-4000:]}"


def test_show_progress_only_on_a_terminal(tmp_path):
    class Tty:
        def isatty(self):
            return True

    assert progress.show_progress(Tty())
    with (tmp_path / "log").open("w") as fh:
        assert not progress.show_progress(fh)
    assert not progress.show_progress(object())  # no isatty
    bar = progress.progress_bar(range(3), file=Tty(), enabled=False)  # --no-progress
    assert bar.disable and list(bar) == [0, 1, 2]


@pytest.mark.slow
def test_train_and_merge_logs_have_no_bars_nor_warnings(tiny_llama, tmp_path):
    """real-data pairs, real-train of a LoRA that trains lm_head of a tied base (as the demo's recipes do), and
    real-merge, each into a log file."""
    recs = tmp_path / "train.jsonl"
    recs.write_text("".join(json.dumps(r) + "\n" for r in toy_training_records()))
    pairs = tmp_path / "pairs"
    text = _logged([str(BIN / "real-data"), "pairs", "--records", str(recs), "--variant", "real",
                    "--output", str(pairs), "--tokenizer", str(tiny_llama)], tmp_path / "pairs.log")
    _quiet(text)

    out = tmp_path / "adapter"
    text = _logged([str(BIN / "real-train"), "--config", str(REPO / "recipes" / "tiny" / "llama-real.yaml"),
                    "--model_name_or_path", str(tiny_llama), "--dataset_name", str(pairs), "--output_dir", str(out),
                    "--lora_modules_to_save", "lm_head", "--max_steps", "2", "--save_strategy", "no"],
                   tmp_path / "train.log")
    _quiet(text)
    assert "real-train: saved to" in text
    assert json.loads((out / "adapter_config.json").read_text())["modules_to_save"] == ["lm_head"]

    text = _logged([str(BIN / "real-merge"), "--adapter", str(out), "--output", str(tmp_path / "merged")],
                   tmp_path / "merge.log")
    _quiet(text)
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False  # the merged output layer is the trained copy


def test_untied_base_gives_the_same_adapter_and_merge_without_warnings(tiny_llama, tmp_path):
    """The untie changes no number: an adapter on lm_head of a tied base, trained (here: perturbed) and merged,
    gives the same logits and the same merged weights with and without it; only peft's warnings go."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from fae.backends.hf import load_hf_model

    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"],
                task_type="CAUSAL_LM")
    ids = torch.tensor([[1, 5, 7, 9, 11, 13]])
    results = []
    for untie in (False, True):
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
        assert base.config.tie_word_embeddings
        if untie:
            assert untie_for_modules(base, lora["modules_to_save"], lora["target_modules"])
            assert not untie_for_modules(base, lora["modules_to_save"])  # once
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            tuned = get_peft_model(base, LoraConfig(**lora))
            with torch.no_grad():
                for p in tuned.parameters():
                    if p.requires_grad:
                        p.add_(0.05 * torch.randn_like(p))
            adapter = tmp_path / f"adapter-{untie}"
            tuned.save_pretrained(str(adapter))
            with torch.no_grad():
                logits = tuned(input_ids=ids).logits
            again = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
            if untie:
                assert untie_for_adapter(again, adapter)
            merged = PeftModel.from_pretrained(again, str(adapter)).merge_and_unload()
        messages = " ".join(str(w.message) for w in seen)
        assert ("tie_word_embeddings" in messages) == (not untie), messages
        assert ("no longer tied" in messages) == (not untie), messages
        with torch.no_grad():
            results.append((logits, merged(input_ids=ids).logits, merged.state_dict()))
    (a, ma, sa), (b, mb, sb) = results
    assert torch.equal(a, b) and torch.equal(ma, mb)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)

    with warnings.catch_warnings(record=True) as seen:  # fae's loader: adapter merged, no warning
        warnings.simplefilter("always")
        lm, _ = load_hf_model(str(tiny_llama), adapter=str(tmp_path / "adapter-True"), device="cpu", dtype="float32")
    assert not any("tie" in str(w.message) for w in seen), [str(w.message) for w in seen]
    with torch.no_grad():
        assert torch.equal(lm(input_ids=ids).logits, mb)


def test_a_base_without_the_layer_in_the_adapter_stays_tied(tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    assert not untie_for_modules(base, None, ["q_proj", "v_proj"])
    assert not untie_for_modules(base, [], "all-linear")
    assert base.config.tie_word_embeddings and base.lm_head.weight is base.get_input_embeddings().weight
    assert untie_for_modules(base, None, r".*\.(q_proj|embed_tokens)")  # a regex over full names
    assert base.lm_head.weight is not base.get_input_embeddings().weight
