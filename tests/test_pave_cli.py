"""`fae pave` end to end: on the local OpenAI-compatible server (with and without logprobs) and a tiny hf model."""

from __future__ import annotations

import json
import math

import pytest

from data_prep.records import save_records
from fae.cli import main
from helpers import make_record_dict
from openai_server import LocalOpenAIServer, claim_of

OTHER = {"SUPPORT": "REFUTE", "REFUTE": "SUPPORT"}
N = 4


def _records(tmp_path, n=8, with_cf=lambda k: True):
    recs = []
    for k in range(n):
        gold = "SUPPORT" if k % 2 == 0 else "REFUTE"
        extra = {}
        if with_cf(k):
            extra["counterfactual_sentences"] = [{"id": 0, "text": f"FAKE statement number {k}."}]
        recs.append(make_record_dict(id=f"r{k}", claim=f"Claim number {k} holds.", label=gold, **extra))
    path = tmp_path / "eval.jsonl"
    save_records(recs, path)
    return path, {f"Claim number {k} holds.": ("SUPPORT" if k % 2 == 0 else "REFUTE", k) for k in range(n)}


def _verifier(golds, bodies):
    """claim-only: state by k % 4 (KK, KU, UK, UU); gold evidence: right; counterfactual: wrong."""

    def respond(body):
        bodies.append(body)
        gold, k = golds[claim_of(body)]
        user = body["messages"][-1]["content"]
        i = body["_choice_index"]
        if "Document:" not in user:
            pattern = {0: [gold] * N, 1: [OTHER[gold]] * N,
                       2: [gold, gold, gold, OTHER[gold]], 3: [OTHER[gold]] * 3 + [gold]}[k % 4]
            label = pattern[i]
        elif "FAKE" in user:
            label = OTHER[gold]
        else:
            label = gold
        return json.dumps({"label": label, "evidence": [0] if "Document:" in user else []})

    return respond


def _logprobs(body, content):
    """Token logprobs: the label token with runs whose confidence varies on claim-only prompts."""
    label = json.loads(content)["label"]
    other = "REFUTE" if label == "SUPPORT" else "SUPPORT"
    claim_only = "Document:" not in body["messages"][-1]["content"]
    p = (0.55 + 0.1 * body["_choice_index"]) if claim_only else 0.97
    head, tail = '{"label": "', content[len('{"label": "') + len(label):]
    tok = lambda t, lp, top=(): {"token": t, "logprob": lp, "bytes": None,  # noqa: E731
                                 "top_logprobs": [{"token": x, "logprob": y, "bytes": None} for x, y in top]}
    return {"content": [tok(head, 0.0), tok(label, math.log(p), [(label, math.log(p)), (other, math.log(1 - p))]),
                        tok(tail, 0.0)], "refusal": None}


def _pave(records, out, url, *extra):
    return main(["pave", "--records", str(records), "--backend", "openai", "--model", "m", "--base-url", url,
                 "--samples", str(N), "--temperature", "0.8", "--jsd-samples", str(N), "--jsd-temperature", "0.8",
                 "--output", str(out), "--no-progress",
                 "--tune-split", "0.5", "--max-retries", "0", *extra])


def test_pave_on_openai_server_with_logprobs(tmp_path, capsys):
    records, golds = _records(tmp_path)
    bodies = []
    with LocalOpenAIServer(responder=_verifier(golds, bodies), logprobs_fn=_logprobs) as srv:
        out = tmp_path / "pave"
        assert _pave(records, out, srv.base_url) == 0
        n_requests = srv.count()
        # resume: a rerun samples nothing new
        assert _pave(records, out, srv.base_url) == 0
        assert srv.count() == n_requests
    assert n_requests == 8 * 3  # one request per (claim, condition), N choices each
    assert all(b["n"] == N and b["temperature"] == 0.8 and b["logprobs"] for b in bodies)
    res = json.loads((out / "pave.json").read_text())
    st = res["profile"]["states"]
    assert [st[s]["n"] for s in ("KK", "KU", "UK", "UU")] == [2, 2, 2, 2]
    # gold evidence always corrects, counterfactual evidence always misleads
    assert res["profile"]["CR"] == 1.0 and res["profile"]["PR"] == 0.0 and res["profile"]["Margin"] == 0.0
    assert st["KK"]["OI"] is None  # PR = 0 -> odds of influence infinite -> null in JSON
    arb = res["arbitration"]
    assert arb["stability"] == ["jsd"] and arb["n_tune"] + arb["n_test"] == 8
    assert arb["baselines"]["evidence_only"]["CE"] == 1.0 and arb["baselines"]["evidence_only"]["IE"] == 0.0
    assert 0 <= arb["OA"] <= 1 and arb["OA"] == pytest.approx((arb["CE"] + arb["IE"]) / 2)
    line = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    probs = line["conditions"]["claim_only"]["probs"]
    assert len(probs) == N and all(sum(p) == pytest.approx(1.0) for p in probs)
    assert probs[0][0] == pytest.approx(0.55)  # r0 gold SUPPORT, first run p = .55
    md = (out / "pave.md").read_text()
    assert "| Known-Knows (persistence) |" in md and "| JSD arbitration |" in md
    assert "Margin +0.000" in capsys.readouterr().out


def test_pave_vote_variant_without_logprobs_and_without_counterfactuals(tmp_path):
    records, golds = _records(tmp_path, with_cf=lambda k: False)
    with LocalOpenAIServer(responder=_verifier(golds, [])) as srv:
        out = tmp_path / "pave"
        assert _pave(records, out, srv.base_url) == 0
        assert _pave(records, tmp_path / "p2", srv.base_url, "--stability", "jsd") == 2  # no probabilities
    res = json.loads((out / "pave.json").read_text())
    assert res["arbitration"]["stability"] == ["vote"]
    assert res["profile"]["PR"] is None and res["arbitration"]["IE"] is None
    assert any("CE only" in n for n in res["notes"])


def test_pave_rejects_greedy_decoding(tmp_path, capsys):
    records, _ = _records(tmp_path, n=2)
    assert main(["pave", "--records", str(records), "--model", "m", "--output", str(tmp_path / "o"),
                 "--temperature", "0"]) == 2
    assert "temperature must be > 0" in capsys.readouterr().err


@pytest.mark.slow
def test_pave_on_tiny_hf_model(tmp_path, tiny_llama):
    records, _ = _records(tmp_path, n=4)
    out = tmp_path / "pave"
    assert main(["pave", "--records", str(records), "--backend", "hf", "--model", str(tiny_llama),
                 "--samples", "3", "--temperature", "1.0", "--jsd-samples", "3", "--max-new-tokens", "12",
                 "--output", str(out), "--no-progress", "--tune-split", "0.5", "--keep-refusals"]) == 0
    res = json.loads((out / "pave.json").read_text())
    assert res["n_claims"] == 4
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    # The random tiny model writes no label prefix ('"label": "') in any run, so every run's distribution is
    # scored after the answer format's default prefix: all runs of a prompt share one distribution, the JSD is
    # 0 everywhere, and auto must choose the vote-based variant, and say why.
    raws = [r for ln in lines for c in ln["conditions"].values() for r in c["raw"]]
    assert raws and not any('"label"' in r for r in raws), raws
    assert all(len({json.dumps(p) for p in c["probs"]}) == 1 for ln in lines for c in ln["conditions"].values())
    assert res["arbitration"]["variant"] == "vote"
    assert "same label distribution" in res["arbitration"]["variant_reason"]
    assert sum(res["profile"]["states"][s]["ratio"] for s in ("KK", "KU", "UK", "UU")) == pytest.approx(1.0)
    for line in lines:
        for cond in ("claim_only", "gold_evidence", "counterfactual"):
            c = line["conditions"][cond]
            assert len(c["answers"]) == 3 and len(c["raw"]) == 3
            assert all(len(p) == 3 and sum(p) == pytest.approx(1.0, abs=1e-5) for p in c["probs"])
    assert (out / "pave.md").is_file()


def _flat_logprobs(body, content):
    """Every run of every prompt gets the same label distribution (what label-first scoring gives)."""
    label = json.loads(content)["label"]
    head, tail = '{"label": "', content[len('{"label": "') + len(label):]
    top = [{"token": x, "logprob": math.log(p), "bytes": None} for x, p in (("SUPPORT", 0.6), ("REFUTE", 0.4))]
    tok = lambda t, lp, top=(): {"token": t, "logprob": lp, "bytes": None, "top_logprobs": list(top)}  # noqa: E731
    return {"content": [tok(head, 0.0), tok(label, math.log(0.6), top), tok(tail, 0.0)], "refusal": None}


def test_identical_run_distributions_switch_to_the_vote_variant_which_beats_evidence_only(tmp_path, capsys):
    """Priors stable and right, gold evidence stable and right, counterfactual runs split 3:2 for the wrong
    label: JSD is 0 everywhere (identical distributions), so only the vote-based variant can keep the prior
    against the counterfactual, and its IE must beat always taking the evidence."""
    records, golds = _records(tmp_path, n=16)

    def respond(body):
        gold, _ = golds[claim_of(body)]
        user, i = body["messages"][-1]["content"], body["_choice_index"]
        label = (OTHER[gold] if i % 2 == 0 else gold) if "FAKE" in user else gold
        return json.dumps({"label": label, "evidence": [0] if "Document:" in user else []})

    with LocalOpenAIServer(responder=respond, logprobs_fn=_flat_logprobs) as srv:
        base = ["pave", "--records", str(records), "--backend", "openai", "--model", "m", "--base-url",
                srv.base_url, "--samples", "4", "--temperature", "0.8", "--no-progress", "--tune-split", "0.5",
                "--max-retries", "0"]  # JSD rule: the paper's defaults, K = 5 at temperature 1.0
        assert main([*base, "--output", str(tmp_path / "auto")]) == 0
        out = capsys.readouterr().out
        assert main([*base, "--output", str(tmp_path / "jsd"), "--stability", "jsd"]) == 0
    res = json.loads((tmp_path / "auto" / "pave.json").read_text())
    arb = res["arbitration"]
    assert arb["variant"] == "vote" and "same label distribution" in arb["variant_reason"]
    assert (arb["runs"], arb["temperature"]) == (5, 1.0)
    md = (tmp_path / "auto" / "pave.md").read_text()
    assert "vote-based variant: binary entropy of k_true/K" in md and "K = 5 runs at temperature 1.0" in md
    assert "JSD rule (vote, K=5, T=1.0)" in out
    ev = arb["baselines"]["evidence_only"]
    assert ev["IE"] == 0.0 and arb["IE"] == 1.0 and arb["CE"] == 1.0 and arb["OA"] > ev["OA"]
    # a second measure: the JSD itself is 0 for every prompt here, so the rule collapses to one source
    forced = json.loads((tmp_path / "jsd" / "pave.json").read_text())["arbitration"]
    assert forced["variant"] == "jsd" and "WARNING" in forced["variant_reason"]
    b = forced["baselines"]
    # with every Δ = 0 a threshold takes all of the evidence or none of it; tuning keeps the source with the
    # better OA on the tuning claims: the prior (right, stable), not the evidence that misleads 3:2
    assert (forced["IE"], forced["CE"]) == (b["claim_only"]["IE"], b["claim_only"]["CE"]) == (1.0, 1.0)
    assert (b["evidence_only"]["IE"], b["evidence_only"]["CE"]) == (0.0, 1.0)
    # the JSD rule's own runs: K = 5 at 1.0 beside the profile's N = 4 at 0.8
    line = json.loads((tmp_path / "auto" / "samples.jsonl").read_text().splitlines()[0])
    assert len(line["conditions"]["claim_only"]["answers"]) == 4
    assert len(line["conditions"]["claim_only@jsd"]["answers"]) == 5


def test_abstaining_priors_are_filtered_by_default_and_counted_per_state(tmp_path):
    """A claim answered NOT_ENOUGH_INFO ten times out of ten leaves the analysis unless --keep-refusals."""
    records, golds = _records(tmp_path, n=9)

    def respond(body):
        gold, k = golds[claim_of(body)]
        user, i = body["messages"][-1]["content"], body["_choice_index"]
        if "Document:" in user:
            label = OTHER[gold] if "FAKE" in user else gold
        elif k % 3 == 0:
            label = "NOT_ENOUGH_INFO"  # abstains: 3 claims
        elif k % 3 == 1:
            label = "NOT_ENOUGH_INFO" if i < 6 else gold  # a NEI majority, not unanimous: filtered, UU
        else:
            label = gold
        return json.dumps({"label": label, "evidence": [0] if "Document:" in user else []})

    with LocalOpenAIServer(responder=respond) as srv:
        args = ["pave", "--records", str(records), "--backend", "openai", "--model", "m", "--base-url",
                srv.base_url, "--samples", "10", "--jsd-samples", "10", "--jsd-temperature", "0.3",
                "--output", str(tmp_path / "p"), "--no-progress", "--tune-split", "0.5", "--max-retries", "0"]
        assert main(args) == 0
        n = srv.count()
        res = json.loads((tmp_path / "p" / "pave.json").read_text())
        md = (tmp_path / "p" / "pave.md").read_text()
        assert main([*args, "--keep-refusals"]) == 0 and srv.count() == n  # analysis only, nothing resampled
    kept = json.loads((tmp_path / "p" / "pave.json").read_text())
    f = res["refusal_filter"]
    assert f["on"] and f["removed"] == 6 and f["removed_by_state"] == {"KK": 0, "KU": 3, "UK": 0, "UU": 3}
    assert res["n_claims"] == 3 and res["profile"]["states"]["KK"]["n"] == 3
    assert "6 of 9 claims removed" in md and "KU 3, UU 3" in md
    assert not kept["refusal_filter"]["on"] and kept["n_claims"] == 9
    assert kept["profile"]["states"]["KU"]["n"] == 3 and kept["profile"]["states"]["UU"]["n"] == 3


def test_fae_run_cross_check_flags_a_verifier_that_abstains_on_gold_only_pools(tmp_path, capsys):
    """Right on full pools (FAE round 0), NOT_ENOUGH_INFO on the gold sentences alone (PAVE): flagged, explained."""
    records, golds = _records(tmp_path, n=6)

    def respond(body):
        gold, _ = golds[claim_of(body)]
        user = body["messages"][-1]["content"]
        if "Grass is green" in user or "Document:" not in user:  # the full pool, or no evidence
            label = gold
        else:  # gold sentences only, or counterfactual
            label = "NOT_ENOUGH_INFO"
        return json.dumps({"label": label, "evidence": [0] if "Document:" in user else []})

    with LocalOpenAIServer(responder=respond) as srv:
        run = tmp_path / "run"
        assert main(["run", "--backend", "openai", "--model", "m", "--base-url", srv.base_url, "--records",
                     str(records), "--output", str(run), "--rounds", "1", "--no-progress"]) == 0
        assert _pave(records, tmp_path / "p", srv.base_url, "--check-run", str(run)) == 0
        assert _pave(records, tmp_path / "q", srv.base_url, "--check-run", str(tmp_path / "nope")) == 2
    chk = json.loads((tmp_path / "p" / "pave.json").read_text())["fae_check"]
    assert chk["fae_round0_accuracy"] == 1.0 and chk["pave_gold_evidence_accuracy"] == 0.0
    assert chk["n_claims"] == 6 and chk["disagree"] and chk["pave_gold_evidence_abstain_share"] == 1.0
    assert chk["same_verifier"]  # the same served model, no adapter
    assert "gold-only pool" in chk["explanation"]
    out = capsys.readouterr().out
    assert "DISAGREEMENT (> 10 points)" in out and "FAE round-0 accuracy 100.00%" in out
    assert "Gold-evidence accuracy beside FAE round 0" in (tmp_path / "p" / "pave.md").read_text()


def test_resume_refuses_a_retrained_adapter_or_rewritten_records_at_the_same_paths(tmp_path, tiny_llama, capsys):
    """The resume fingerprint holds the contents (sha256) of the records and the adapter, not only their paths:
    samples of the old adapter or counterfactuals are never mixed with new ones."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    def save_adapter(seed: int) -> None:
        torch.manual_seed(seed)
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama), lora).save_pretrained(tmp_path / "adapter")

    records, _ = _records(tmp_path, n=2)
    out = tmp_path / "pave"
    cmd = ["pave", "--records", str(records), "--backend", "hf", "--model", str(tiny_llama), "--adapter",
           str(tmp_path / "adapter"), "--samples", "2", "--temperature", "1.0", "--jsd-samples", "2",
           "--max-new-tokens", "4", "--output", str(out), "--no-progress", "--tune-split", "0.5",
           "--keep-refusals"]
    save_adapter(0)
    assert main(cmd) == 0
    first = (out / "samples.jsonl").read_bytes()
    cfg = json.loads((out / "config.json").read_text())
    assert len(cfg["records_sha256"]) == len(cfg["adapter_sha256"]) == 64
    capsys.readouterr()

    def refused_for(what: str) -> None:
        capsys.readouterr()  # what the test itself printed (saving an adapter)
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"holds samples made with different settings or inputs ({what});" in err, err
        assert (out / "samples.jsonl").read_bytes() == first  # nothing sampled, nothing cut

    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    trained = weights.read_bytes()
    weights.write_bytes(trained[:-1] + bytes([trained[-1] ^ 1]))  # one weight's bytes changed in place
    refused_for("adapter_sha256")
    save_adapter(1)  # retrained in place
    refused_for("adapter_sha256")
    weights.write_bytes(trained)

    original = records.read_text()
    records.write_text(original.replace("Claim number 1 holds.", "Claim number 1 holds today."))  # the records
    refused_for("records_sha256")
    # the counterfactual evidence rebuilt into the records (what `real-data counterfactual` writes): refused too
    records.write_text(original.replace("FAKE statement number 1", "FAKE claim-aware rewrite 1"))
    refused_for("records_sha256")

    records.write_text(original)  # the same inputs again: resumes, nothing left to sample
    assert main(cmd) == 0
    assert (out / "samples.jsonl").read_bytes() == first


def test_prefill_once_reaches_the_sampler_and_never_resumes_a_run_made_without_it(tmp_path, tiny_llama, capsys,
                                                                                monkeypatch):
    """--prefill-once is recorded in config.json with the dtype the samples were made in; a rerun that differs in
    either is refused (on an AMX CPU one prefill gives other samples), an older config.json without the flag
    reads as off, and one without the hf dtype is refused rather than guessed."""
    import fae.pave.sampling as sampling
    from fae.backends.hf import resolve_dtype

    seen = []
    original = sampling.one_row_prefill

    def spy(lm, enabled=True):
        seen.append(enabled)
        return original(lm, enabled=enabled)

    monkeypatch.setattr(sampling, "one_row_prefill", spy)
    records, _ = _records(tmp_path, n=2)
    out = tmp_path / "pave"
    cmd = ["pave", "--records", str(records), "--backend", "hf", "--model", str(tiny_llama), "--samples", "2",
           "--temperature", "1.0", "--jsd-samples", "2", "--max-new-tokens", "4", "--output", str(out),
           "--no-progress", "--tune-split", "0.5", "--keep-refusals"]
    assert main(cmd + ["--prefill-once"]) == 0
    assert seen and all(seen)  # every prompt's generate ran with one prefill
    cfg = json.loads((out / "config.json").read_text())
    auto = str(resolve_dtype("auto", "cpu")).replace("torch.", "")
    assert cfg["prefill_once"] is True and cfg["dtype"] == auto
    first = (out / "samples.jsonl").read_bytes()
    other_dtype = "fp32" if auto == "bfloat16" else "bf16"
    for argv, what in ((cmd, "prefill_once"), (cmd + ["--prefill-once", "--dtype", other_dtype], "dtype")):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"holds samples made with different settings or inputs ({what});" in err, err
        assert (out / "samples.jsonl").read_bytes() == first
    seen.clear()
    assert main(cmd + ["--prefill-once"]) == 0 and not seen  # the same settings: resumed, nothing left to sample
    assert (out / "samples.jsonl").read_bytes() == first

    del cfg["prefill_once"]  # a config.json from before the flag: it was off
    (out / "config.json").write_text(json.dumps(cfg))
    assert main(cmd) == 0 and not seen
    del cfg["dtype"]  # before the hf dtype was recorded: which one made the samples is unknown
    (out / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main(cmd) == 2
    assert "(dtype (not recorded there));" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size is an option of --backend vllm; --backend hf"),
    (["--backend", "openai", "--base-url", "http://x/v1", "--dtype", "bf16"], "--dtype is an option of --backend hf"),
    (["--backend", "vllm", "--concurrency", "4"], "--concurrency is an option of --backend openai"),
    (["--backend", "openai", "--base-url", "http://x/v1", "--prefill-once"],
     "--prefill-once is an option of --backend hf; --backend openai does not read it"),
])
def test_pave_refuses_an_option_of_another_backend(tmp_path, capsys, argv, message):
    """The backends' options come from their dataclasses; one set for another backend would be ignored."""
    from fae.cli import main

    assert main(["pave", "--records", str(tmp_path / "r.jsonl"), "--output", str(tmp_path / "o"),
                 "--model", "m", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_pave_declares_the_backends_options_with_their_defaults():
    import dataclasses

    from fae.backends.hf import HFOptions
    from fae.backends.openai_backend import OpenAIOptions
    from fae.backends.vllm_backend import VLLMOptions
    from real_fae_core.cli import command_parser
    from fae.pave import runner as cli  # the command's module: PaveConfig, its backends' field names

    p = command_parser("fae pave", cli.PaveConfig)
    args = p.parse_args(["--records", "r", "--output", "o", "--model", "m"])
    for cls, names in ((HFOptions, cli.HF_FIELDS), (VLLMOptions, cli.VLLM_FIELDS), (OpenAIOptions, cli.OPENAI_FIELDS)):
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        assert {n: getattr(args, n) for n in names} == {n: defaults[n] for n in names}
    assert p.parse_args(["--records", "r", "--output", "o", "--model", "m", "--trust-remote-code"]).trust_remote_code


def test_pave_as_a_python_function_gives_what_the_command_line_gives(tmp_path, tiny_llama):
    """run(PaveConfig(...)) samples the same answers as `fae pave` and returns pave.json's numbers."""
    from fae.pave.runner import PaveConfig, run

    records, _ = _records(tmp_path, n=2)
    settings = {"samples": 2, "temperature": 1.0, "jsd_samples": 2, "max_new_tokens": 4, "tune_split": 0.5}
    assert main(["pave", "--records", str(records), "--backend", "hf", "--model", str(tiny_llama),
                 "--output", str(tmp_path / "cli"), "--no-progress", "--keep-refusals",
                 *[w for k, v in settings.items() for w in ("--" + k.replace("_", "-"), str(v))]]) == 0
    res = run(PaveConfig(records=records, model=tiny_llama, output=tmp_path / "py", progress=False,
                         keep_refusals=True, **settings))
    assert res.ok and res.outputs["samples"] == str(tmp_path / "py" / "samples.jsonl")
    for name in ("samples.jsonl", "pave.json", "pave.md", "config.json"):
        assert (tmp_path / "py" / name).read_text() == (tmp_path / "cli" / name).read_text(), name
    assert json.loads(json.dumps(res.summary)) == json.loads((tmp_path / "py" / "pave.json").read_text())


def test_pave_takes_no_batch_size_but_its_default(tmp_path, capsys):
    """PAVE samples one prompt at a time (a prompt's answers are seeded by its own key): --batch-size other than
    8 would do nothing, so it is refused, on the command line and from Python alike."""
    from fae.pave.runner import PaveConfig, run
    from real_fae_core.errors import UserError

    records, _ = _records(tmp_path, n=2)
    assert main(["pave", "--records", str(records), "--model", "m", "--output", str(tmp_path / "o"),
                 "--batch-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size 4: fae pave samples one prompt at a time" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    with pytest.raises(UserError, match="^--batch-size 2: fae pave samples one prompt at a time"):
        run(PaveConfig(records=records, model="m", output=tmp_path / "o", batch_size=2))
    with pytest.raises(UserError, match="^PaveConfig: samples: must be >= 2, got 1$"):
        PaveConfig(records=records, model="m", output=tmp_path / "o", samples=1)
    with pytest.raises(UserError, match="temperature must be > 0"):
        run(PaveConfig(records=records, model="m", output=tmp_path / "o", temperature=0.0))
    with pytest.raises(UserError, match="--backend hf, openai, vllm, not 'local'"):
        run(PaveConfig(records=records, model="m", output=tmp_path / "o", backend="local"))
    assert not (tmp_path / "o").exists()
