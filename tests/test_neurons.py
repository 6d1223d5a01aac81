"""`fae neurons`: coverage rule, overlap statistics, streaming vs brute force."""

import json
import math

import numpy as np
import pytest
import torch
from probe_data import (  # noqa: F401  (tiny_gemma3 is a fixture)
    make_lora_adapter,
    make_records,
    tiny_gemma3,
    with_nonzero_pad,
    write_jsonl,
)
from safetensors.torch import load_file

from data_prep.prompts import (
    encode_chat,
    render_evidence_prompt,
    render_knowledge_prompt,
)
from data_prep.records import ClaimRecord
from fae.backends.hf import load_hf_model as load_model
from fae.cli import main
from fae.probes.neuron_activations import find_down_projs
from fae.probes.neuron_overlap import coverage_set, overlap_stats
from fae.probes.neuron_report import lens_area, venn_distance


def test_coverage_set_smallest_prefix():
    s = np.array([1.0, 5.0, 0.0, 3.0, 1.0])  # total 10
    assert np.flatnonzero(coverage_set(s, 0.9)).tolist() == [0, 1, 3]  # 5+3+1 = 9 (tie -> idx 0)
    assert np.flatnonzero(coverage_set(s, 0.8)).tolist() == [1, 3]  # 5+3 = 8 reaches exactly
    assert np.flatnonzero(coverage_set(s, 0.81)).tolist() == [0, 1, 3]
    assert np.flatnonzero(coverage_set(s, 1.0)).tolist() == [0, 1, 3, 4]  # zeros never needed
    assert not coverage_set(np.zeros(4), 0.9).any()
    with pytest.raises(ValueError):
        coverage_set(s, 0.0)


def test_overlap_stats():
    a = np.array([1, 1, 1, 0, 0], bool)
    b = np.array([0, 1, 1, 1, 0], bool)
    st = overlap_stats(a, b)
    assert (st["intersection"], st["union"], st["evidence_only"], st["knowledge_only"]) == (2, 4, 1, 1)
    assert st["jaccard"] == 0.5 and st["overlap_of_evidence"] == pytest.approx(2 / 3)
    assert overlap_stats(np.zeros(3, bool), np.zeros(3, bool))["jaccard"] is None


def test_venn_distance_gives_requested_overlap():
    r1, r2 = 1.0, 0.6
    for area in (0.05, 0.3, 0.9):
        assert lens_area(r1, r2, venn_distance(r1, r2, area)) == pytest.approx(area, rel=1e-6)


def _brute_force(model_path, records, coverage, adapter=None):
    """One claim at a time, every activation kept, sets by sorting in plain Python."""
    model, tok = load_model(model_path, adapter, dtype="fp32")
    mods = find_down_projs(model)
    acts = {p: [[] for _ in mods] for p in ("evidence", "knowledge")}
    cur = {}
    hooks = [m.register_forward_pre_hook(
        lambda mod, args, k=k: acts[cur["p"]][k].append(args[0][0].detach().clone()))
        for k, (_, _, m) in enumerate(mods)]
    for rec in records:
        for p, msgs in (("evidence", render_evidence_prompt(rec)),
                        ("knowledge", render_knowledge_prompt(rec))):
            cur["p"] = p
            with torch.no_grad():
                model(input_ids=torch.tensor([encode_chat(tok, msgs)]))
    for h in hooks:
        h.remove()
    means = {p: np.stack([torch.cat(a).abs().double().mean(0).numpy() for a in acts[p]])
             for p in acts}

    def top_set(values):
        order = sorted(range(len(values)), key=lambda i: (-values[i], i))
        total, run, keep = sum(values), 0.0, set()
        for i in order:
            if run >= coverage * total:
                break
            keep.add(i)
            run += values[i]
        return keep

    per_layer = {p: [top_set(list(means[p][k])) for k in range(len(mods))] for p in means}
    width = means["evidence"].shape[1]
    glob = {p: top_set(list(means[p].reshape(-1))) for p in means}
    return means, per_layer, glob, width


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_neurons_match_brute_force(arch, tiny_llama, tiny_qwen, tiny_gemma3, tmp_path):
    src = {"llama": tiny_llama, "qwen2": tiny_qwen, "gemma3": tiny_gemma3}[arch]
    model = with_nonzero_pad(src, tmp_path / "m")
    recs = make_records(5, nei=1)
    path = write_jsonl(tmp_path / "eval.jsonl", recs)
    out = tmp_path / "n"
    assert main(["neurons", "--records", str(path), "--model", str(model), "--output", str(out),
                 "--coverage", "0.9", "--batch-size", "3", "--limit", "4", "--dtype", "fp32"]) == 0
    res = json.loads((out / "neurons.json").read_text())
    stats = load_file(str(out / "neuron_stats.safetensors"))
    assert res["n_claims"] == 4
    assert (out / "neurons_venn.png").read_bytes()[:4] == b"\x89PNG"
    assert "| layer |" in (out / "neurons.md").read_text()

    used = [ClaimRecord.from_dict(r) for r in recs[:4]]  # NEI record skipped, --limit 4
    means, per_layer, glob, width = _brute_force(model, used, 0.9)
    np.testing.assert_allclose(stats["mean_abs_evidence"].numpy(), means["evidence"], rtol=1e-4)
    np.testing.assert_allclose(stats["mean_abs_knowledge"].numpy(), means["knowledge"], rtol=1e-4)

    for k, row in enumerate(res["per_layer"]):
        a, b = per_layer["evidence"][k], per_layer["knowledge"][k]
        assert set(np.flatnonzero(stats["set_layer_evidence"][k].numpy())) == a
        assert set(np.flatnonzero(stats["set_layer_knowledge"][k].numpy())) == b
        assert row["evidence_size"] == len(a) and row["knowledge_size"] == len(b)
        assert row["intersection"] == len(a & b)
        assert row["jaccard"] == pytest.approx(len(a & b) / len(a | b))
        assert 0 < len(a) < width  # the rule really selects a strict subset
    ga, gb = glob["evidence"], glob["knowledge"]
    assert set(np.flatnonzero(stats["set_global_evidence"].numpy().reshape(-1))) == ga
    o = res["overall"]
    assert (o["evidence_size"], o["knowledge_size"], o["intersection"]) == (
        len(ga), len(gb), len(ga & gb))
    assert o["overlap_of_knowledge"] == pytest.approx(len(ga & gb) / len(gb))
    # Evidence prompts are longer: more tokens were accumulated for them.
    assert res["tokens"]["evidence"] > res["tokens"]["knowledge"] > 0


def test_neurons_with_lora_on_down_proj(tiny_llama, tmp_path):
    adapter = make_lora_adapter(tiny_llama, tmp_path / "lora", targets=("q_proj", "down_proj"))
    model, _ = load_model(tiny_llama, adapter, dtype="fp32")
    names = [n for _, n, _ in find_down_projs(model)]
    assert len(names) == 2 and all(n.endswith("layers.%d.mlp.down_proj" % i)
                                   for i, n in enumerate(names))
    recs = make_records(3)
    path = write_jsonl(tmp_path / "eval.jsonl", recs)
    for name, extra in (("base", []), ("lora_out", ["--adapter", str(adapter)])):
        assert main(["neurons", "--records", str(path), "--model", str(tiny_llama),
                     "--output", str(tmp_path / name), "--dtype", "fp32", *extra]) == 0
    base = load_file(str(tmp_path / "base" / "neuron_stats.safetensors"))
    lora = load_file(str(tmp_path / "lora_out" / "neuron_stats.safetensors"))
    # LoRA on q_proj of layer 0 changes what layer 1's MLP sees; layer 0's MLP input is
    # unchanged only if attention was untouched, which it is not.
    assert not torch.allclose(base["mean_abs_evidence"], lora["mean_abs_evidence"])
    means, per_layer, _, _ = _brute_force(tiny_llama, [ClaimRecord.from_dict(r) for r in recs],
                                          0.9, adapter)
    np.testing.assert_allclose(lora["mean_abs_evidence"].numpy(), means["evidence"], rtol=1e-4)
    assert math.isclose(json.loads((tmp_path / "lora_out" / "neurons.json").read_text())
                        ["coverage"], 0.9)


def test_neurons_as_a_python_function_gives_what_the_command_line_gives(tiny_llama, tmp_path):
    """run(NeuronsConfig(...)) writes the files `fae neurons` writes and returns neurons.json's numbers."""
    from fae.probes.neurons import NeuronsConfig, run
    from real_fae_core.errors import UserError

    recs = make_records(4, nei=1)
    path = write_jsonl(tmp_path / "eval.jsonl", recs)
    assert main(["neurons", "--records", str(path), "--model", str(tiny_llama), "--output", str(tmp_path / "cli"),
                 "--coverage", "0.8", "--batch-size", "2", "--include-nei"]) == 0
    res = run(NeuronsConfig(records=path, model=tiny_llama, output=tmp_path / "py", coverage=0.8, batch_size=2,
                            include_nei=True))
    assert res.ok and res.outputs["neurons"] == str(tmp_path / "py" / "neurons.json")
    assert sorted(res.outputs) == ["neurons", "plot", "report", "stats"]
    written = json.loads((tmp_path / "py" / "neurons.json").read_text())
    assert written == json.loads((tmp_path / "cli" / "neurons.json").read_text())
    assert json.loads(json.dumps(res.summary)) == written and res.summary["n_claims"] == 5  # NEI included
    assert (tmp_path / "py" / "neurons.md").read_text() == (tmp_path / "cli" / "neurons.md").read_text()
    a = load_file(str(tmp_path / "py" / "neuron_stats.safetensors"))
    b = load_file(str(tmp_path / "cli" / "neuron_stats.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(UserError, match=r"^NeuronsConfig: coverage: must be <= 1, got 1.5$"):
        NeuronsConfig(records=path, model=tiny_llama, output=tmp_path / "x", coverage=1.5)
