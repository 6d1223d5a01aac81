"""`fae neurons`: MLP neuron overlap of evidence- vs knowledge-based prompts (SPEC §7).

A neuron is one input channel of a layer's ``mlp.down_proj``, i.e. one entry
of ``act_fn(gate_proj(x)) * up_proj(x)``. Over the prompt tokens of a
calibration set (padding masked out), each paradigm accumulates the sum of
``|activation|`` per neuron and the token count in float64 running sums, so
memory does not grow with the number of claims. Neurons are ranked by mean
absolute activation; a paradigm's set is the smallest top-k set whose
cumulative share of the total reaches ``--coverage`` (ties: lower index
first).

Two scopes are reported:

- per layer: ranking and total within each layer;
- overall: one global ranking over all neurons of all layers, with the
  total summed over all layers (the paper's single Venn diagram). The sum of
  the per-layer sets is reported too (``per_layer_sum``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Iterator

import numpy as np

from real_fae_core.atomicio import atomic_file, atomic_write_json, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, field_names, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import Output, claim_dir, only_names
from real_fae_core.labels import NOT_ENOUGH_INFO
from real_fae_core.runlock import RunLock
from data_prep.records import ClaimRecord, RecordError, iter_records
from fae.backends.hf import load_hf_model
from fae.probes.neuron_overlap import analyse
from fae.probes.neuron_report import markdown, plot_venn
from fae.backends.options import HFLoadFields


@dataclasses.dataclass
class NeuronsFields:
    """`fae neurons`'s own options (the hf backend's loading options follow in :class:`NeuronsConfig`)."""

    records: str = option(help="calibration records JSONL (e.g. eval.jsonl)")
    model: str = option(help="base model directory (HF format)")
    output: str = option(help="directory for neurons.json/.md/_venn.png")
    adapter: str | None = option(None, help="optional PEFT/LoRA adapter directory")
    coverage: float = option(0.9, above=0, max=1,
                             help="share of the total |activation| the kept set must reach (default 0.9)")
    limit: int | None = option(None, min=1, help="use only the first N usable records")
    batch_size: int = option(8, min=1, help="prompts per forward pass (default 8)")
    include_nei: bool = option(False, help="also use NOT_ENOUGH_INFO records (excluded by default, as in FAE)")


@dataclasses.dataclass
class NeuronsConfig(HFLoadFields, NeuronsFields, CommandConfig):
    """`fae neurons`: MLP neuron overlap of evidence- vs knowledge-based prompts."""

    # its own options, then the hf backend's loading options as `fae run --backend hf` has them (under its
    # heading: their fields' `group`)
    COMMAND_FIELDS = field_names(NeuronsFields, HFLoadFields)


def _usable(path: str, include_nei: bool, limit: int | None) -> Iterator[ClaimRecord]:
    n = 0
    for rec in iter_records(path):
        if rec.label == NOT_ENOUGH_INFO and not include_nei:
            continue
        yield rec
        n += 1
        if limit is not None and n >= limit:
            return


def run(config: NeuronsConfig) -> CommandResult:
    """`fae neurons` as a function: neurons.json, neurons.md, neurons_venn.png and neuron_stats.safetensors in
    ``config.output``; ``summary`` holds the overlap. A missing records file is one error before any model loads."""
    if not Path(config.records).is_file():
        raise UserError(f"--records {config.records!r}: file not found")
    out = Path(config.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; give a directory")
    claim_dir(out, "fae neurons", inputs=[config.records, config.adapter,
                                           config.model if Path(config.model).exists() else None],
              legacy=only_names("neurons.json", "neurons.md", "neurons_venn.png", "neuron_stats.safetensors"))
    with RunLock(out, "fae neurons", is_dir=True):  # one writer for the command's lifetime
        return _neurons(config, out)


def _neurons(config: NeuronsConfig, out: Path) -> CommandResult:
    from fae.probes.neuron_activations import accumulate  # loads torch: not for `fae --help`

    model, tok = load_hf_model(config.model, config.adapter, device=config.device, dtype=config.dtype,
                               trust_remote_code=config.trust_remote_code)
    counter = {"n": 0}

    def counted():
        for rec in _usable(config.records, config.include_nei, config.limit):
            counter["n"] += 1
            yield rec

    try:
        acc = accumulate(model, tok, counted(), batch_size=config.batch_size, progress=True,
                         total=config.limit)
    except RecordError as exc:
        raise UserError(str(exc)) from None
    if counter["n"] == 0:
        raise UserError(f"{config.records}: no usable records (NOT_ENOUGH_INFO ones are skipped "
                        f"unless --include-nei)")
    mean_ev, mean_kn = acc.mean_abs("evidence"), acc.mean_abs("knowledge")
    result = analyse(mean_ev, mean_kn, acc.layers, config.coverage)
    masks = result.pop("_masks")

    Output(out, "fae neurons").mark()
    meta = {
        "model": str(config.model),
        "adapter": None if config.adapter is None else str(config.adapter),
        "records": str(config.records),
        "n_claims": counter["n"],
        "coverage": config.coverage,
        "tokens": dict(acc.tokens),
        "modules": [name for _, name, _ in acc.modules],
        "score": "mean |input of mlp.down_proj| over all prompt tokens (padding excluded)",
        "overall_scope": "one ranking and one total over all neurons of all layers",
    }
    atomic_write_json(out / "neurons.json", {**meta, **result})
    import torch
    from safetensors.torch import save_file

    tensors = {
        "mean_abs_evidence": torch.from_numpy(mean_ev.astype(np.float32)),
        "mean_abs_knowledge": torch.from_numpy(mean_kn.astype(np.float32)),
    }
    tensors.update({f"set_{k}": torch.from_numpy(v.astype(np.uint8)) for k, v in masks.items()})
    with atomic_file(out / "neuron_stats.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"layers": json.dumps(acc.layers), "coverage": str(config.coverage)})
    plot_venn(result["overall"], out / "neurons_venn.png",
              f"Neurons covering {config.coverage:.0%} of |activation|")
    md = markdown(result, meta)
    atomic_write_text(out / "neurons.md", md)
    print(md, end="")
    print(f"fae neurons: wrote {out / 'neurons.json'}, neurons.md, neurons_venn.png")
    outputs = {"neurons": str(out / "neurons.json"), "report": str(out / "neurons.md"),
               "stats": str(out / "neuron_stats.safetensors"), "plot": str(out / "neurons_venn.png")}
    return CommandResult(outputs=outputs, summary={**meta, **result})
