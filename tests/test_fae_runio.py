"""claims.jsonl append/resume/merge, config.json resume checks, option merging, recipes."""

import json
from pathlib import Path

import pytest

from data_prep.core.errors import UserError
from fae.ablation import cli as run_cli
from fae.ablation import options
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


def test_merge_orders_by_record_dedups_and_removes_shards(tmp_path):
    (tmp_path / "claims.jsonl").write_text(json.dumps(line("c")) + "\n")
    runio.shard_path(tmp_path, 0).write_text(json.dumps(line("a")) + "\n" + json.dumps(line("c")) + "\n")
    runio.shard_path(tmp_path, 1).write_text(json.dumps(line("b")) + "\n" + json.dumps(line("d"))[:5])
    assert runio.finished_ids(tmp_path) == {"a", "b", "c"}
    merged = runio.merge_claims(tmp_path, ["a", "b", "c", "d"])
    assert [c["id"] for c in merged] == ["a", "b", "c"]
    assert [c["id"] for c in runio.read_claims(tmp_path / "claims.jsonl")] == ["a", "b", "c"]
    assert not list(tmp_path.glob("claims.rank*"))
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
    opts, _config, _given = options.parse_run_args(["--config", str(cfg), "--records", "r.jsonl", "--output", "o",
                                                    "--model", "from-cli", "--rounds", "4"])
    assert opts.model == "from-cli" and opts.rounds == 4  # CLI wins
    assert opts.backend == "openai" and opts.batch_size == 3 and opts.request_timeout == 5.0
    assert opts.progress is False
    assert opts.max_new_tokens == options.FaeRunArguments().max_new_tokens  # default kept


def test_unknown_or_bad_yaml_keys_name_file_and_key(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: m\nbatchsize: 4\n")
    with pytest.raises(UserError, match=r"bad\.yaml: unknown key 'batchsize'"):
        options.parse_run_args(["--config", str(cfg)])
    cfg.write_text("model: m\nrounds: many\n")
    with pytest.raises(UserError, match=r"bad\.yaml: key 'rounds'"):
        options.parse_run_args(["--config", str(cfg)])
    with pytest.raises(UserError, match="missing --records, --output"):
        options.parse_run_args(["--model", "m"])


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes" / "eval").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_eval_recipes_are_valid(recipe):
    opts = options.load_yaml_options(str(recipe))
    assert opts["backend"] in ("hf", "openai", "vllm") and opts["model"]
    assert "api_key" not in opts  # keys come from the environment only


def test_command_line_is_recorded_from_the_given_flags():
    args = run_cli.parse_args(["--records", "r.jsonl", "--output", "o d", "--model", "m", "--no-progress"])
    assert run_cli.command_line(args.given) == \
        "fae run --records r.jsonl --output 'o d' --model m --no-progress"
