"""The resume fingerprint (real_fae_core.fingerprint): one write, one check, one table of compatibility defaults.

Every command that resumes uses it (fae run and its shards, fae pave, fae study); a run written by an older
version, without a key a later one added, reads with that key's compatibility default. The committed studies
check against their own study.json as they are. Fast: no model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from real_fae_core.errors import UserError
from real_fae_core.fingerprint import COMPATIBILITY_DEFAULTS, RunFingerprint

ROOT = Path(__file__).resolve().parents[1]


def _fingerprints() -> dict[str, RunFingerprint]:
    from fae.ablation.runio import RUN_FINGERPRINT
    from fae.pave.runner import PAVE_FINGERPRINT
    from fae.study.responses import STUDY_FINGERPRINT

    return {f.command: f for f in (RUN_FINGERPRINT, PAVE_FINGERPRINT, STUDY_FINGERPRINT)}


def test_every_compatibility_default_is_a_key_of_its_commands_fingerprint():
    fingerprints = _fingerprints()
    assert set(COMPATIBILITY_DEFAULTS) == set(fingerprints)
    for command, defaults in COMPATIBILITY_DEFAULTS.items():
        assert set(defaults) <= set(fingerprints[command].keys), command


def test_the_compatibility_defaults_are_the_values_runs_were_made_with_before():
    run = COMPATIBILITY_DEFAULTS["fae run"]
    assert run == {"control": "none", "control_seed": None, "gold_only": False, "cited_only": False,
                   "size_sweep": False, "sweep_seed": None, "line_ids": "original", "constrained_decoding": False}
    assert COMPATIBILITY_DEFAULTS["fae pave"] == {"line_ids": "original", "constrained_decoding": False,
                                                  "prefill_once": False}


def test_a_record_without_a_key_reads_with_its_default_and_keeps_what_it_holds():
    fp = RunFingerprint("fae run", ("model", "gold_only", "line_ids"))
    old = {"model": "m", "line_ids": "renumbered"}
    assert fp.upgraded(old) == {**COMPATIBILITY_DEFAULTS["fae run"], "model": "m", "line_ids": "renumbered"}
    assert fp.of(old) == {"model": "m", "gold_only": False, "line_ids": "renumbered"}
    assert fp.differences(old, {"model": "m", "gold_only": False, "line_ids": "renumbered"}) == []
    (d,) = fp.differences(old, {"model": "m", "gold_only": True, "line_ids": "renumbered"})
    assert (d.key, d.old, d.new, d.recorded, str(d)) == ("gold_only", False, True, True, "gold_only: False -> True")


def test_a_key_without_a_default_is_named_as_not_recorded():
    fp = RunFingerprint("fae study", ("model", "dtype"), "study.json")
    (d,) = fp.differences({"model": "m"}, {"model": "m", "dtype": "float32"})
    assert d.key == "dtype" and not d.recorded


def test_extends_holds_on_resume_only_and_equal_always():
    fp = RunFingerprint("x", ("ids", "path", "sha"),
                        equal={"path": lambda old, new: bool(old.get("sha") or new.get("sha"))},
                        extends={"ids": lambda old, new: set(old["ids"]) <= set(new["ids"])})
    old, new = {"ids": ["a"], "path": "p", "sha": "s"}, {"ids": ["a", "b"], "path": "q", "sha": "s"}
    assert fp.differences(old, new) == []
    assert [d.key for d in fp.differences(old, new, resume=False)] == ["ids"]
    assert [d.key for d in fp.differences({**old, "sha": None}, {**new, "sha": None})] == ["path"]


def test_write_then_check_refuses_with_the_commands_line_and_writes_nothing(tmp_path):
    fp = RunFingerprint("fae study", ("model", "seeds"), "study.json")
    assert fp.check(tmp_path, {"model": "m"}, str) is None  # nothing stored: nothing to check
    fp.write(tmp_path, {"model": "m", "seeds": [1, 2], "command": "fae study ..."})
    assert fp.check(tmp_path, {"model": "m", "seeds": [1, 2], "command": "other"}, str)["command"] == "fae study ..."
    with pytest.raises(UserError, match=r"^refused: model: 'm' -> 'n'; seeds: \[1, 2\] -> \[1\]$"):
        fp.check(tmp_path, {"model": "n", "seeds": [1]},
                 lambda diffs: "refused: " + "; ".join(map(str, diffs)))
    assert json.loads((tmp_path / "study.json").read_text())["model"] == "m"
    assert [p.name for p in tmp_path.iterdir()] == ["study.json"]  # no temporary left


@pytest.mark.parametrize("text, reason", [("{", "not valid JSON"), ("[1]", "not a mapping")])
def test_a_stored_file_that_is_no_record_is_one_line(tmp_path, text, reason):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(UserError, match=f"config.json: {reason}.*; use another --output$"):
        RunFingerprint("fae pave", ("model",)).check(tmp_path, {}, str, advice="use another --output")


def test_the_refusals_keep_each_commands_wording(tmp_path):
    from fae.ablation import runio
    from fae.study.responses import check_fingerprint

    runio.RUN_FINGERPRINT.write(tmp_path, {"model": "a", **runio.claim_set(["x"])})  # a run before the arms
    runio.check_resume(tmp_path, {"model": "a", **runio.claim_set(["x", "y"]), **COMPATIBILITY_DEFAULTS["fae run"]})
    with pytest.raises(UserError, match=r"holds a run with different settings \(gold_only: False -> True\); use a "
                                        r"fresh --output directory or the original settings to resume$"):
        runio.check_resume(tmp_path, {"model": "a", "gold_only": True, **runio.claim_set(["x"])})
    (tmp_path / "study.json").write_text(json.dumps({"model": "a"}))
    with pytest.raises(UserError, match=r"holds a shard made with other settings or inputs \(model: 'a' -> 'b'\); "):
        check_fingerprint(tmp_path, {"model": "b"}, "a shard")


@pytest.mark.parametrize("study", sorted((ROOT / "benchmarks/results/study/studies").glob("*/study.json")),
                         ids=lambda p: p.parent.name)
def test_the_committed_studies_check_against_their_own_fingerprint(study):
    from fae.study.responses import STUDY_FINGERPRINT, check_fingerprint

    stored = json.loads(study.read_text(encoding="utf-8"))
    check_fingerprint(study.parent, stored)  # resumes as it is
    assert STUDY_FINGERPRINT.upgraded(stored) == stored  # read unchanged
