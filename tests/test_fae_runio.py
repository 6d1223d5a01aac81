"""claims.jsonl append/resume/merge, config.json resume checks, option merging, recipes."""

import json
from pathlib import Path

import pytest

from real_fae_core.errors import UserError
from fae.ablation.runner import FaeRunConfig, load_yaml_options
from helpers import parse_run_args
from fae.ablation import runio


REPO = Path(__file__).resolve().parents[1]


def line(cid):
    return {"id": cid, "gold_label": "SUPPORT", "gold_groups": [[0]], "rounds": [{"round": 0}]}


def test_truncated_last_line_is_ignored_then_cut_by_the_writer(tmp_path):
    path = tmp_path / "claims.jsonl"
    path.write_text(json.dumps(line("a")) + "\n" + json.dumps(line("b"))[:17])  # killed mid-write
    assert [c["id"] for c in runio.read_claims(path)] == ["a"]
    assert path.read_text().endswith('"gold')  # reading alone does not touch the file
    with runio.ClaimWriter(path) as w:
        w([line("b"), line("c")])
    assert [c["id"] for c in runio.read_claims(path)] == ["a", "b", "c"]
    assert path.read_text().count("\n") == 3


def test_a_corrupt_complete_line_is_an_error_with_file_and_line(tmp_path):
    path = tmp_path / "claims.jsonl"
    path.write_text(json.dumps(line("a")) + "\n{oops\n")
    with pytest.raises(UserError, match=r"claims.jsonl:2"):
        runio.read_claims(path)


def test_merge_orders_by_record_dedups_and_keeps_shards(tmp_path):
    (tmp_path / "claims.jsonl").write_text(json.dumps(line("c")) + "\n")
    for i, text in ((0, json.dumps(line("a")) + "\n" + json.dumps(line("c")) + "\n"),
                    (1, json.dumps(line("b")) + "\n" + json.dumps(line("d"))[:5])):
        (tmp_path / "shards" / f"{i}-of-2").mkdir(parents=True)
        (tmp_path / "shards" / f"{i}-of-2" / "claims.jsonl").write_text(text)
    assert runio.finished_ids(tmp_path) == {"a", "b", "c"}
    merged = runio.merge_claims(tmp_path, ["a", "b", "c", "d"])
    assert [c["id"] for c in merged] == ["a", "b", "c"]
    assert [c["id"] for c in runio.read_claims(tmp_path / "claims.jsonl")] == ["a", "b", "c"]
    assert len(runio.shard_claim_files(tmp_path)) == 2  # each shard keeps its own record
    with pytest.raises(UserError, match="not in the records file"):
        runio.merge_claims(tmp_path, ["a", "b"])


def test_resume_refuses_a_run_with_other_settings(tmp_path):
    cfg = {"records_sha256": "x", "backend": "hf", "model": "m", "adapter": None, "adapter_sha256": None,
           "rounds": 4, "decoding": {"greedy": True, "max_new_tokens": 64}, "prompt_format_version": 1,
           "command": "fae run a", **runio.claim_set(["a", "b"])}
    with pytest.raises(UserError, match="no config.json"):  # orphan answers
        runio.check_resume(tmp_path, cfg)
    runio.write_json_atomic(tmp_path / "config.json", cfg)
    assert runio.check_resume(tmp_path, dict(cfg, command="fae run b"))["command"] == "fae run a"
    with pytest.raises(UserError, match=r"rounds: 4 -> 2; decoding: "):
        runio.check_resume(tmp_path, dict(cfg, rounds=2, decoding={"greedy": True, "max_new_tokens": 8}))
    with pytest.raises(UserError, match="records_sha256"):
        runio.check_resume(tmp_path, dict(cfg, records_sha256="y"))
    with pytest.raises(UserError, match="prompt_format_version: 1 -> 2"):
        runio.check_resume(tmp_path, dict(cfg, prompt_format_version=2))
    with pytest.raises(UserError, match="claim set: 2 claims -> 1 claims"):
        runio.check_resume(tmp_path, {**cfg, **runio.claim_set(["a"])})
    assert runio.check_resume(tmp_path, {**cfg, **runio.claim_set(["a", "b", "c"])})  # grows: extended


# ---------------------------------------------------------------------------
# options: YAML < command line (more in test_fae_run_options.py)
# ---------------------------------------------------------------------------


def test_cli_flags_override_yaml_and_yaml_overrides_defaults(tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text("backend: openai\nmodel: from-yaml\nbatch-size: 3\nrounds: 2\nrequest_timeout: 5\n"
                   "progress: false\n")
    opts, _config = parse_run_args(["--config", str(cfg), "--records", "r.jsonl", "--output", "o",
                                                    "--model", "from-cli", "--rounds", "4"])
    assert opts.model == "from-cli" and opts.rounds == 4  # CLI wins
    assert opts.backend == "openai" and opts.batch_size == 3 and opts.request_timeout == 5.0
    assert opts.progress is False
    assert opts.max_new_tokens == FaeRunConfig().max_new_tokens  # default kept


def test_unknown_or_bad_yaml_keys_name_file_and_key(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: m\nbatchsize: 4\n")
    with pytest.raises(UserError, match=r"bad\.yaml:2: batchsize: unknown key \(did you mean 'batch_size'\?\)"):
        parse_run_args(["--config", str(cfg)])
    cfg.write_text("model: m\nrounds: many\n")
    with pytest.raises(UserError, match=r"bad\.yaml:2: rounds: must be an integer"):
        parse_run_args(["--config", str(cfg)])
    with pytest.raises(UserError, match="missing --records, --output"):
        parse_run_args(["--model", "m"])


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes" / "eval").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_eval_recipes_are_valid(recipe):
    opts = load_yaml_options(str(recipe))
    assert opts["backend"] in ("hf", "openai", "vllm") and opts["model"]
    assert "api_key" not in opts  # keys come from the environment only


# ---------------------------------------------------------------------------
# the one torn-tail-tolerant reader of append-only JSONL (claims.jsonl, pave's samples.jsonl)
# ---------------------------------------------------------------------------


def test_read_appended_skips_a_torn_tail_and_repairs_only_when_asked(tmp_path):
    from real_fae_core.jsonl import RecordError, read_appended

    path = tmp_path / "out.jsonl"
    assert read_appended(path) == []  # missing: nothing finished yet
    path.write_bytes(b'{"a": 1}\n\n[2]\n{"b": ')
    assert read_appended(path) == [(1, {"a": 1}), (3, [2])]
    assert path.read_bytes().endswith(b'{"b": ')  # reading alone does not touch the file
    assert read_appended(path, repair=True) == [(1, {"a": 1}), (3, [2])]
    assert path.read_bytes() == b'{"a": 1}\n\n[2]\n'
    path.write_bytes(b'{"a": 1}\n{oops\n\xff\n')
    (n1, _), (n2, bad), (n3, enc) = read_appended(path)
    assert (n2, n3) == (2, 3) and isinstance(bad, RecordError) and isinstance(enc, RecordError)
    assert "invalid JSON" in str(bad.located(path, n2)) and f"{path}:2" in str(bad.located(path, n2))
    assert "not valid UTF-8" in str(enc)


def test_pave_samples_resume_cuts_a_torn_line_and_names_a_bad_one(tmp_path):
    from fae.pave.io import read_samples

    path = tmp_path / "samples.jsonl"
    good = {"id": "r0", "gold_label": "SUPPORT", "conditions": {"claim_only": {"answers": ["SUPPORT"]}}}
    path.write_text(json.dumps(good) + "\n" + json.dumps(good)[:20])
    assert read_samples(path) == {"r0": good}
    assert path.read_text() == json.dumps(good) + "\n"  # the kill's half line is gone before appending
    path.write_text(json.dumps(good) + "\n" + json.dumps(["not", "a", "line"]) + "\n")
    with pytest.raises(UserError, match=r"samples.jsonl:2: not a samples line"):
        read_samples(path)
    path.write_text("{oops\n")
    with pytest.raises(UserError, match=r"samples.jsonl:1: invalid JSON"):
        read_samples(path)


def test_run_data_names_the_line_claim_and_field(tmp_path):
    (tmp_path / "claims.jsonl").write_text(json.dumps(line("a")) + "\n" + json.dumps(line("b")) + "\n")
    runio.write_json_atomic(tmp_path / "config.json", {"command": "fae run x", **runio.claim_set(["a", "b"])})
    data = runio.load_run(tmp_path)
    err = data.claim_error(data.claims[1], "rounds[0].cited", "must be a list of sentence ids")
    assert str(err) == f"{tmp_path / 'claims.jsonl'}:2: claim 'b': field 'rounds[0].cited': must be a list of sentence ids"
