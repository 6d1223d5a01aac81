"""The output guard (real_fae_core/outputs.py, docs/errors.md "Outputs"): no command deletes or overwrites
what it did not write.

Each case runs a command the way a user would, on an output that is its own input, contains one, is the
current directory, or is a folder someone else filled, and checks one error line, exit 2 and every file
still there, byte for byte. The positive cases check that an output the command wrote itself (marked, or an
earlier version's) is still replaced with --overwrite or resumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep.cli import main as real_data
from data_prep.records import ClaimRecord, save_records
from fae.cli import main as fae
from helpers import make_record_dict
from real_fae_core.outputs import MARKER, read_marker
from retrieval_helpers import abstract_corpus, write_jsonl

SCIFACT = Path(__file__).parent / "data" / "scifact"
DEMO = Path(__file__).resolve().parents[1] / "real" / "demo" / "base"


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative name -> bytes): what must survive a refused command."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- real-data index / retrieve

def _world(folder: Path) -> tuple[Path, Path, Path]:
    """Claims, corpus and index of a two-document SciFact-style corpus, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = abstract_corpus(folder / "corpus.jsonl", {"1": ["Aspirin lowers fever in adults.", "Other text."],
                                                       "2": ["Fever is common."]})
    claims = write_jsonl(folder / "claims.jsonl", [
        {"id": 1, "claim": "Aspirin lowers fever.", "evidence": {"1": [{"sentences": [0], "label": "SUPPORT"}]},
         "cited_doc_ids": [1]}])
    index = folder / "idx.sqlite"
    assert real_data(["index", "--corpus", str(corpus), "--format", "scifact", "--output", str(index)]) == 0
    return claims, corpus, index


def _retrieve(claims, corpus, index, out, *extra) -> int:
    return real_data(["retrieve", "--dataset", "scifact", "--claims", str(claims), "--corpus", str(corpus),
                      "--index", str(index), "--output", str(out), *extra])


def test_retrieve_overwrite_into_the_folder_of_its_inputs_deletes_nothing(tmp_path, capsys):
    w = tmp_path / "w"
    claims, corpus, index = _world(w)
    (w / "notes.txt").write_text("mine\n")
    before = _snapshot(w)
    capsys.readouterr()
    assert _retrieve(claims, corpus, index, w, "--overwrite") == 2
    assert f"--output {w}: contains the input {claims}" in _error(capsys)
    assert _snapshot(w) == before


def test_index_onto_its_own_corpus_is_refused(tmp_path, capsys):
    corpus = abstract_corpus(tmp_path / "c.jsonl", {"1": ["Aspirin lowers fever."]})
    before = corpus.read_bytes()
    assert real_data(["index", "--corpus", str(corpus), "--format", "scifact", "--output", str(corpus),
                      "--overwrite"]) == 2
    assert f"--output {corpus}: is the input {corpus}" in _error(capsys)
    assert corpus.read_bytes() == before


def test_index_overwrite_replaces_an_index_but_not_another_file(tmp_path, capsys):
    claims, corpus, index = _world(tmp_path / "w")
    other = tmp_path / "notes.sqlite"
    other.write_text("not an index\n")
    assert real_data(["index", "--corpus", str(corpus), "--format", "scifact", "--output", str(other),
                      "--overwrite"]) == 2
    assert f"--output {other}: is a file real-data index did not write" in _error(capsys)
    assert other.read_text() == "not an index\n"
    # its own index is replaced
    assert real_data(["index", "--corpus", str(corpus), "--format", "scifact", "--output", str(index),
                      "--overwrite"]) == 0


@pytest.mark.parametrize("where", [".", ".."])
def test_retrieve_into_the_current_directory_or_its_parent_is_refused(tmp_path, capsys, monkeypatch, where):
    claims, corpus, index = _world(tmp_path / "in")
    run = tmp_path / "cwd"
    run.mkdir()
    (run / "notes.txt").write_text("mine\n")
    monkeypatch.chdir(run)
    before = _snapshot(tmp_path)
    capsys.readouterr()
    assert _retrieve(claims, corpus, index, where, "--overwrite") == 2
    assert "current directory" in _error(capsys)
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "in"]  # no stray .PID.*.old folder


def test_retrieve_into_a_foreign_folder_is_refused_even_with_overwrite(tmp_path, capsys):
    claims, corpus, index = _world(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("# mine\n")
    capsys.readouterr()
    assert _retrieve(claims, corpus, index, out, "--overwrite") == 2
    assert f"--output {out}: is a non-empty folder that real-data retrieve did not write" in _error(capsys)
    assert _snapshot(out) == {"report.md": b"# mine\n"}


def test_retrieve_overwrite_replaces_its_own_output_and_only_that(tmp_path, capsys):
    claims, corpus, index = _world(tmp_path / "in")
    out = tmp_path / "out"
    assert _retrieve(claims, corpus, index, out) == 0
    assert read_marker(out)["command"] == "real-data retrieve"
    assert _retrieve(claims, corpus, index, out) == 2  # without --overwrite
    assert "pass --overwrite" in capsys.readouterr().err
    assert _retrieve(claims, corpus, index, out, "--overwrite") == 0
    (out / "notes.txt").write_text("mine\n")  # a file the command did not write
    capsys.readouterr()
    assert _retrieve(claims, corpus, index, out, "--overwrite") == 2
    assert "would delete files real-data retrieve did not write (notes.txt)" in _error(capsys)
    assert (out / "notes.txt").read_text() == "mine\n"


def test_retrieve_overwrite_replaces_an_output_of_an_earlier_version(tmp_path, capsys):
    claims, corpus, index = _world(tmp_path / "in")
    out = tmp_path / "out"
    assert _retrieve(claims, corpus, index, out) == 0
    (out / MARKER).unlink()  # as written before the marker existed
    assert _retrieve(claims, corpus, index, out, "--overwrite") == 0
    assert (out / MARKER).is_file()


def test_retrieve_inside_an_input_folder_is_refused(tmp_path, capsys):
    claims, corpus, index = _world(tmp_path / "in")
    fever = tmp_path / "wiki-pages"
    fever.mkdir()
    (fever / "wiki-001.jsonl").write_text("")
    out = fever / "out"
    assert real_data(["index", "--corpus", str(fever), "--format", "fever", "--output", str(out)]) == 2
    assert f"--output {out}: is inside the input {fever}" in _error(capsys)
    assert not out.exists()


# ---------------------------------------------------------------- fae run

def _records(path: Path) -> Path:
    save_records([ClaimRecord.from_dict(make_record_dict())], path)
    return path


def _fae_run(records: Path, out, *extra) -> int:
    return fae(["run", "--backend", "openai", "--model", "verifier", "--base-url", "http://127.0.0.1:9/v1",
                "--records", str(records), "--output", str(out), "--rounds", "1", "--no-progress", "--max-retries", "0",
                *extra])


def test_fae_run_into_a_folder_that_was_never_a_run_overwrites_nothing(tmp_path, capsys):
    records = _records(tmp_path / "records.jsonl")
    m = tmp_path / "m"
    m.mkdir()
    (m / "report.md").write_text("# my report\n")
    (m / "metrics.json").write_text('{"mine": 1}\n')
    before = _snapshot(m)
    assert _fae_run(records, m) == 2
    assert f"--output {m}: is a non-empty folder that fae run did not write" in _error(capsys)
    assert _snapshot(m) == before


@pytest.mark.parametrize("case", ["adapter", "contains", "cwd"])
def test_fae_run_onto_its_input_or_the_current_directory_is_refused(tmp_path, capsys, monkeypatch, case):
    records = _records(tmp_path / "records.jsonl")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}\n")
    out = {"adapter": adapter, "contains": tmp_path, "cwd": "."}[case]
    if case == "cwd":
        monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    assert _fae_run(records, out, "--adapter", str(adapter)) == 2
    assert {"adapter": f"is the input {adapter}", "contains": "contains the input",
            "cwd": "is the current directory"}[case] in _error(capsys)
    assert _snapshot(tmp_path) == before


def test_fae_run_marks_its_run_and_an_earlier_versions_run_still_resumes(tmp_path, capsys):
    records = _records(tmp_path / "records.jsonl")
    new, old = tmp_path / "new", tmp_path / "old"
    assert _fae_run(records, new) != 2  # the server is not there: a runtime failure, not a refusal
    assert read_marker(new)["command"] == "fae run"
    old.mkdir()
    (old / "config.json").write_text("{}\n")  # a run of an earlier version: no marker
    capsys.readouterr()
    _fae_run(records, old)
    assert "did not write" not in capsys.readouterr().err
    assert read_marker(old)["command"] == "fae run"


# ---------------------------------------------------------------- every command that writes

def _runs(tmp: Path) -> tuple[Path, Path]:
    from fae_helpers import write_run

    return write_run(tmp / "runs" / "a", 0), write_run(tmp / "runs" / "b", 1)


def _case(name: str, tmp: Path) -> tuple[list[str], str, Path]:
    """(argv, what the error says, the folder whose files must all survive) for one refused command line."""
    records = _records(tmp / "in" / "records.jsonl")
    if name == "pairs: output containing its records, --overwrite":
        return (["real-data", "pairs", "--records", str(records), "--variant", "real", "--output", str(tmp / "in"),
                 "--overwrite"], f"contains the input {records}", tmp / "in")
    if name == "convert: output is its corpus":
        corpus = tmp / "in" / "corpus.jsonl"
        corpus.write_bytes((SCIFACT / "corpus_cited.jsonl").read_bytes())
        claims = tmp / "in" / "claims.jsonl"
        claims.write_bytes((SCIFACT / "claims_dev.jsonl").read_bytes())
        return (["real-data", "convert", "--dataset", "scifact", "--claims", str(claims), "--corpus", str(corpus),
                 "--output", str(corpus)], f"is the input {corpus}", tmp / "in")
    if name == "counterfactual-audit: output containing its records":
        return (["real-data", "counterfactual-audit", "--records", str(records), "--output", str(tmp / "in")],
                f"contains the input {records}", tmp / "in")
    a, b = _runs(tmp)
    foreign = tmp / "mine"
    foreign.mkdir()
    (foreign / "report.md").write_text("# my own report\n")
    (foreign / "compare.md").write_text("# my own comparison\n")
    (foreign / "notes.txt").write_text("mine\n")
    if name == "report: output is a run":
        return ["fae", "report", str(a), str(b), "--output", str(a)], f"is the input {a}", tmp / "runs"
    if name == "report: a foreign folder":
        return (["fae", "report", str(a), str(b), "--output", str(foreign)],
                "is a non-empty folder that fae report did not write", foreign)
    if name == "report: the current directory":
        return (["fae", "report", str(a), str(b), "--output", "."], "is the current directory", foreign)
    if name == "compare: output containing its runs":
        return (["fae", "compare", str(a), str(b), "--output", str(tmp / "runs")],
                f"contains the input {a}", tmp / "runs")
    if name == "compare: a foreign folder":
        return (["fae", "compare", str(a), str(b), "--output", str(foreign)],
                "is a non-empty folder that fae compare did not write", foreign)
    if name == "view: the current directory":
        empty = tmp / "empty"
        empty.mkdir()
        return ["fae", "view", str(a), "--output", str(empty / ".")], "is the current directory", tmp
    if name == "probe: output is its run":
        return (["fae", "probe", str(a), "--model", str(tmp / "no-model"), "--output", str(a)],
                f"is the input {a}", tmp / "runs")
    if name == "probe-report: a foreign folder":
        return (["fae", "probe-report", str(a), "--output", str(foreign)],
                "is a non-empty folder that fae probe-report did not write", foreign)
    if name == "neurons: output containing its records":
        return (["fae", "neurons", "--records", str(records), "--model", str(tmp / "no-model"),
                 "--output", str(tmp / "in")], f"contains the input {records}", tmp / "in")
    if name == "study-report: output inside a study":
        return (["fae", "study-report", str(a), "--output", str(a / "report")], f"is inside the input {a}",
                tmp / "runs")
    # the commands that write one file: a folder is refused, and so is an input (checked before any is read)
    annotators = tmp / "in" / "annotators.yaml"
    annotators.write_text("annotators: []\n")
    if name == "enhance: a foreign folder":
        return (["real-data", "enhance", "--records", str(records), "--annotators", str(annotators),
                 "--output", str(foreign)], f"--output {foreign}: is a folder", foreign)
    if name == "enhance: output is its annotators file":
        return (["real-data", "enhance", "--records", str(records), "--annotators", str(annotators),
                 "--output", str(annotators)], f"is the input {annotators}", tmp / "in")
    if name == "counterfactual: a foreign folder":
        return (["real-data", "counterfactual", "--records", str(records), "--kinds", "entity",
                 "--output", str(foreign)], f"--output {foreign}: is a folder", foreign)
    if name == "counterfactual: output containing its records":
        return (["real-data", "counterfactual", "--records", str(records), "--kinds", "entity",
                 "--output", str(tmp / "in")], f"contains the input {records}", tmp / "in")
    if name == "families: a foreign folder":  # refused by its own check of a folder, before the guard
        return (["real-data", "families", "--records", str(records), "--output", str(foreign)],
                "is a directory; give a file path", foreign)
    if name == "families: output is a link to its records":
        link = tmp / "in" / "latest.jsonl"
        link.symlink_to(records)
        return (["real-data", "families", "--records", str(records), "--output", str(link)],
                f"is the input {records}", tmp / "in")
    # the commands that write a folder
    pave = ["fae", "pave", "--records", str(records), "--backend", "openai", "--model", "m", "--base-url",
            "http://127.0.0.1:9/v1", "--max-retries", "0", "--no-progress"]
    if name == "pave: a foreign folder":
        return [*pave, "--output", str(foreign)], "is a non-empty folder that fae pave did not write", foreign
    if name == "pave: output inside its check run":
        return ([*pave, "--check-run", str(a), "--output", str(a / "pave")], f"is inside the input {a}",
                tmp / "runs")
    if name.startswith("study:"):
        pools = _pools(tmp / "study-in")
        study = ["fae", "study", "--pools", str(pools), "--backend", "openai", "--model", "m", "--base-url",
                 "http://127.0.0.1:9/v1", "--no-progress"]
        if name == "study: a foreign folder":
            return [*study, "--output", str(foreign)], "is a non-empty folder that fae study did not write", foreign
        if name == "study: output inside its pools":
            return ([*study, "--output", str(pools / "study")], f"is inside the input {pools}",
                    tmp / "study-in")
    if name.startswith("from-inspect:"):
        pytest.importorskip("inspect_ai", reason="Inspect AI is the optional extra [inspect]")
        log = tmp / "in" / "log.eval"
        log.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: the guard refuses before it is read
        if name == "from-inspect: a foreign folder":
            return (["fae", "from-inspect", str(log), "--output", str(foreign)],
                    "is a non-empty folder that fae from-inspect did not write", foreign)
        if name == "from-inspect: output containing its log":
            return ["fae", "from-inspect", str(log), "--output", str(tmp / "in")], f"contains the input {log}", \
                tmp / "in"
    raise AssertionError(name)


def _pools(folder: Path) -> Path:
    """The smallest pools `fae study` reads: `real-data retrieve` of one claim, packed at 128 tokens."""
    from retrieval_helpers import tiny_cross_encoder

    claims, corpus, index = _world(folder)
    pools = folder / "pools"
    reranker = tiny_cross_encoder(folder / "ce")  # two orderings: `fae study` refuses pools of one before its output
    assert _retrieve(claims, corpus, index, pools, "--budgets", "128", "--tokenizer", str(DEMO),
                     "--reranker", str(reranker)) == 0
    return pools


CASES = ["pairs: output containing its records, --overwrite", "convert: output is its corpus",
         "counterfactual-audit: output containing its records", "report: output is a run",
         "report: a foreign folder", "report: the current directory", "compare: output containing its runs",
         "compare: a foreign folder", "view: the current directory", "probe: output is its run",
         "probe-report: a foreign folder", "neurons: output containing its records",
         "study-report: output inside a study",
         "enhance: a foreign folder", "enhance: output is its annotators file", "counterfactual: a foreign folder",
         "counterfactual: output containing its records", "families: a foreign folder",
         "families: output is a link to its records", "pave: a foreign folder", "pave: output inside its check run",
         "study: a foreign folder", "study: output inside its pools", "from-inspect: a foreign folder",
         "from-inspect: output containing its log"]


@pytest.mark.parametrize("name", CASES)
def test_every_writing_command_refuses_in_one_line_and_deletes_nothing(tmp_path, capsys, monkeypatch, name):
    argv, says, kept = _case(name, tmp_path)
    if name == "report: the current directory":
        monkeypatch.chdir(kept)
    if name == "view: the current directory":
        monkeypatch.chdir(tmp_path / "empty")
    before = _snapshot(kept)
    capsys.readouterr()
    main = real_data if argv[0] == "real-data" else fae
    assert main(argv[1:]) == 2
    assert says in _error(capsys)
    assert _snapshot(kept) == before
    assert not [p for p in tmp_path.rglob(".*.old")]  # no stray folder of a failed swap


def test_a_folder_marked_by_another_command_is_refused_unless_empty(tmp_path, capsys):
    a, b = _runs(tmp_path)
    out = tmp_path / "out"
    assert fae(["compare", str(a), str(b), "--output", str(out)]) == 0
    assert read_marker(out)["command"] == "fae compare"
    capsys.readouterr()
    assert fae(["report", str(a), str(b), "--output", str(out)]) == 2
    assert f"--output {out}: is an output of fae compare, not of fae report" in _error(capsys)
    assert fae(["compare", str(a), str(b), "--output", str(out)]) == 0  # its own: rewritten
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / MARKER).write_text('{"command": "fae compare", "files": []}\n')  # it stopped before writing
    assert fae(["report", str(a), str(b), "--output", str(empty)]) == 0
    assert read_marker(empty)["command"] == "fae report"


# ---------------------------------------------------------------- real-merge, real-import-gguf

# Only the training tests import the trainer (tests/test_architecture.py): its two commands that write a model
# run in one child process, each on its own folders, the way their console scripts run them.
_TRAINER_COMMANDS = """
import contextlib, io, json, sys
from real.gguf_import import main as gguf
from real.merge import main as merge
results = []
for prog, argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = {"real-merge": merge, "real-import-gguf": gguf}[prog](argv)
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def _trainer_case(name: str, tmp: Path) -> tuple[list[str], str, Path]:
    """(argv, what the error says, the folder whose files must all survive), as :func:`_case`."""
    tmp.mkdir(parents=True)
    foreign = tmp / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    adapter = tmp / "adapter"  # no base model there: without the guard the command fails on that, not on us
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "./no-base"}\n')
    gguf = tmp / "in" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(60))  # the magic only: the guard refuses before the file is read
    if name == "real-merge: a foreign folder, --overwrite":
        return (["real-merge", "--adapter", str(adapter), "--output", str(foreign), "--overwrite"],
                "is a non-empty folder that real-merge did not write", foreign)
    if name == "real-merge: output inside its adapter":
        return (["real-merge", "--adapter", str(adapter), "--output", str(adapter / "merged")],
                f"is inside the input {adapter}", adapter)
    if name == "real-import-gguf: a foreign folder, --overwrite":
        return (["real-import-gguf", str(gguf), "--output", str(foreign), "--overwrite"],
                "is a non-empty folder that real-import-gguf did not write", foreign)
    if name == "real-import-gguf: output containing its GGUF file":
        return ["real-import-gguf", str(gguf), "--output", str(gguf.parent)], f"contains the input {gguf}", gguf.parent
    raise AssertionError(name)


TRAINER_CASES = ["real-merge: a foreign folder, --overwrite", "real-merge: output inside its adapter",
                 "real-import-gguf: a foreign folder, --overwrite", "real-import-gguf: output containing its GGUF file"]


@pytest.fixture(scope="module")
def trainer_refusals(tmp_path_factory) -> dict[str, tuple[int, str, dict, dict, str]]:
    """Each case of TRAINER_CASES run: (exit code, stderr, its folder's files before, after, what the error
    must say)."""
    root = tmp_path_factory.mktemp("trainer")
    cases = {name: _trainer_case(name, root / str(i)) for i, name in enumerate(TRAINER_CASES)}
    before = {name: _snapshot(kept) for name, (_, _, kept) in cases.items()}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                      os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", _TRAINER_COMMANDS,
                           json.dumps([[argv[0], argv[1:]] for argv, _, _ in cases.values()])],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: (code, err, before[name], _snapshot(cases[name][2]), cases[name][1])
            for (name, (code, err)) in zip(cases, results)}


@pytest.mark.parametrize("name", TRAINER_CASES)
def test_the_trainers_writing_commands_refuse_in_one_line_and_delete_nothing(trainer_refusals, name):
    code, err, before, after, says = trainer_refusals[name]
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert says in lines[0], err
    assert after == before
