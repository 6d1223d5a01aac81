"""`real-merge --adapter DIR --output DIR`: fold a LoRA adapter into its base model.

The merged model is a plain ``transformers`` checkpoint (safetensors) that
vLLM or ``from_pretrained`` load without PEFT, so FAE runs at full speed. The
adapter directory's tokenizer and generation config (with the chat
template's end-of-turn token as eos) are carried over.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path
from typing import Literal

from real_fae_core.atomicio import atomic_dir, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, add_config_arguments, option
from real_fae_core.entry import run_guarded
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_dir, model_folder
from real_fae_core.tied_embeddings import untie_for_adapter

logger = logging.getLogger("real.merge")
DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclasses.dataclass
class MergeConfig(CommandConfig):
    """`real-merge`: fold a LoRA adapter into its base model."""

    adapter: str = option(help="LoRA adapter directory written by real-train")
    output: str = option(help="where to save the merged model")
    base: str | None = option(None, help="base model (default: base_model_name_or_path of the adapter)")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = option(  # DTYPES
        "auto", choices=DTYPES, help="dtype to load and save the base in (default auto)")
    trust_remote_code: bool = option(False, help="allow custom model code from the base repo")
    overwrite: bool = option(False, help="replace an existing output directory")


CONFIG = MergeConfig


def merge_adapter(adapter: str, output: str, *, base: str | None = None, dtype: str = "auto",
                  trust_remote_code: bool = False, overwrite: bool = False) -> Path:
    """Merge ``adapter`` into its base (or ``base``) and save to ``output``."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    ad = Path(adapter)
    cfg_path = ad / "adapter_config.json"
    if ad.exists() and not ad.is_dir():
        raise UserError(f"adapter {adapter!r} is a file; give the adapter directory written by real-train")
    if not cfg_path.is_file():
        raise UserError(f"{adapter!r} has no adapter_config.json, so it is not a LoRA adapter directory")
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise UserError(f"output {output!r} is a file; give a directory for the merged model")
    guard = claim_dir(out, "real-merge", inputs=[adapter, base if base and Path(base).exists() else None],
                      overwrite=overwrite, legacy=model_folder())
    base = base or json.loads(cfg_path.read_text()).get("base_model_name_or_path")
    if not base:
        raise UserError(f"{cfg_path} names no base model; pass --base")
    if not Path(base).exists() and (base.startswith((".", "/", "~"))):
        raise UserError(f"base model path {base!r} does not exist (pass --base to point at it)")

    kwargs = dict(trust_remote_code=trust_remote_code, use_safetensors=True,
                  dtype=dtype if dtype == "auto" else getattr(torch, dtype))
    try:
        model = AutoModelForCausalLM.from_pretrained(base, **kwargs)
    except OSError as exc:
        raise UserError(f"could not load base model {base!r} ({str(exc).splitlines()[0]})") from None
    try:
        untie_for_adapter(model, ad)  # an adapter that trains lm_head of a tied base: merged, they differ
        model = PeftModel.from_pretrained(model, str(ad)).merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as exc:  # shapes or module names of another base model
        raise UserError(f"adapter {adapter!r} does not fit base model {base!r} "
                        f"({str(exc).strip().splitlines()[0][:300]}); pass the base it was trained on with --base") \
            from None

    tok_src = ad if (ad / "tokenizer_config.json").is_file() else Path(base)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_src), trust_remote_code=trust_remote_code)
    if (ad / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(ad))

    with atomic_dir(out, replace=overwrite) as tmp:  # the merged model appears whole or not at all
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        card = ad / "README.md"
        if card.is_file():
            text = card.read_text(encoding="utf-8")
            atomic_write_text(tmp / "README.md", text.replace("library_name: peft", "library_name: transformers")
                              + f"\nMerged from adapter `{ad.resolve()}` into `{base}` with `real-merge`.\n")
        guard.mark(tmp)
    return out


def main(argv: list[str] | None = None) -> int:
    """`real-merge ...`: merge an adapter into its base model; the exit code, every failure as one line."""
    return run_guarded("real-merge", _main, argv)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `real-merge`, one option per field of :class:`MergeConfig`."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="real-merge", description=__doc__.splitlines()[0])
    add_config_arguments(p, MergeConfig)
    return p


def run(config: MergeConfig) -> CommandResult:
    """`real-merge` as a function: the merged model in ``config.output``."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    out = merge_adapter(config.adapter, config.output, base=config.base, dtype=config.dtype,
                        trust_remote_code=config.trust_remote_code, overwrite=config.overwrite)
    print(f"real-merge: merged model saved to {out}")
    return CommandResult(outputs={"model": str(out)})


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return run(CONFIG.from_namespace(args)).exit_code


if __name__ == "__main__":
    raise SystemExit(main())
