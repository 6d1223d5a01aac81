"""Hostile input and failing disks through the real data commands (issue #12).

Each row: a command (`real-data validate|convert|pairs`, `fae run`), an input
built on disk, the expected exit code (2 bad input, 1 disk failure, 0 fine)
and a fragment of the one-line message. Every command runs as a real
subprocess; none may print a traceback, and a failed write leaves nothing
under the output's name (no partial file, no ``*.tmp``).

Failing disks are real: a full disk is ``RLIMIT_FSIZE`` with SIGXFSZ ignored
(writes fail with EFBIG), a read-only one is a 0555 output directory with the
command started without CAP_DAC_OVERRIDE (root ignores permission bits otherwise).
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import REPO, make_record_dict

pytestmark = pytest.mark.slow  # ~12 subprocesses

FULL_DISK_BYTES = 16 * 1024
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2  # <linux/prctl.h>, <linux/capability.h>


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------

def _records_text(n: int = 3, **overrides) -> str:
    return "".join(json.dumps(make_record_dict(id=f"r{i}", **overrides)) + "\n" for i in range(n))


def _write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def latin1(path: Path) -> Path:
    good = _records_text(2)
    bad = json.dumps(make_record_dict(id="r9", claim="Caf\u00e9 au lait."), ensure_ascii=False)
    return _write(path, good.encode("utf-8") + bad.encode("latin-1") + b"\n")


def utf16(path: Path) -> Path:
    return _write(path, _records_text(2).encode("utf-16"))


def gzipped(path: Path) -> Path:
    return _write(path, gzip.compress(_records_text(2).encode("utf-8")))


def directory(path: Path) -> Path:
    path.mkdir()
    (path / "records.jsonl").write_text(_records_text(1), encoding="utf-8")
    return path


def surrogate(path: Path) -> Path:
    # json.dumps escapes the lone surrogate as "\ud800": valid JSON, unwritable as UTF-8.
    line = json.dumps(make_record_dict(id="s1", sentences=[{"id": 0, "text": "bad \ud800 text"}], evidence=[[0]]))
    return _write(path, _records_text(1) + line + "\n")


def utf8_bom(path: Path) -> Path:
    return _write(path, b"\xef\xbb\xbf" + _records_text(2).encode("utf-8"))


def deep_json(path: Path) -> Path:
    return _write(path, _records_text(1) + '{"id": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")


def huge_number(path: Path) -> Path:
    return _write(path, _records_text(1) + '{"id": ' + "7" * 5000 + "}\n")


def many_bad(path: Path) -> Path:
    return _write(path, _records_text(400, label="MAYBE"))


def good(path: Path) -> Path:
    return _write(path, _records_text(300))


def gold_only_second(path: Path) -> Path:
    """The first record has enhanced evidence, the second (line 2) is the first without it."""
    rows = [make_record_dict(id="e0", enhanced_evidence=[0, 3])] + [make_record_dict(id=f"g{i}") for i in (1, 2)]
    return _write(path, "".join(json.dumps(r) + "\n" for r in rows))


def plain_file(path: Path) -> Path:
    return _write(path, "not a directory\n")


def _cc_claim(i: int, claim: str | None = None) -> dict:
    return {"id": f"c{i}", "claim": claim or f"Claim number {i} about the abstract.", "cord_id": "abc",
            "label": "SUPPORT", "evidence_set": [{"sent_index": 1, "type": "PRIMARY"}], "is_auth": False}


def cc_claims(n: int = 300):
    def make(path: Path) -> Path:
        return _write(path, "".join(json.dumps(_cc_claim(i)) + "\n" for i in range(n)))
    return make


def cc_latin1(path: Path) -> Path:
    bad = json.dumps(_cc_claim(2, "Caf\u00e9 claim."), ensure_ascii=False).encode("latin-1")
    return _write(path, cc_claims(2)(path).read_bytes() + bad + b"\n")


def cc_gzip(path: Path) -> Path:
    return _write(path, gzip.compress(cc_claims(3)(path).read_bytes()))


def cc_surrogate(path: Path) -> Path:
    return _write(path, json.dumps(_cc_claim(1, "claim \ud800")) + "\n")


def cc_dir(path: Path) -> Path:
    path.mkdir()
    return path


def cc_corpus(path: Path) -> Path:
    return _write(path, json.dumps({"cord_id": "abc", "title": "t", "abstract": ["S0.", "S1.", "S2."]}) + "\n")


def cc_corpus_surrogate(path: Path) -> Path:
    # the second document's abstract holds "\ud800": it reached SQLite as a UnicodeEncodeError before
    return _write(path, cc_corpus(path).read_text() + json.dumps({"cord_id": "def", "title": "u",
                                                                  "abstract": ["fine", "bad \ud800"]}) + "\n")


def run_yaml(device: str = "toaster"):
    """A `fae run --config` file (named in.jsonl like every input here) whose 4th line sets ``device``."""
    def make(path: Path) -> Path:
        records = good(path.parent / "records.jsonl")
        return _write(path, f"records: {records}\nmodel: {path.parent / 'no-model'}\n"
                            f"output: {path.parent / 'run'}\ndevice: {device}\n")
    return make


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------

VALIDATE = ["real-data", "validate", "{input}"]
CONVERT = ["real-data", "convert", "--dataset", "check-covid", "--claims", "{input}",
           "--corpus", "{world}/corpus.json", "--output", "{out}/records.jsonl"]
PAIRS = ["real-data", "pairs", "--records", "{input}", "--variant", "sft", "--output", "{out}/pairs"]
FAE_RUN = ["fae", "run", "--records", "{input}", "--model", "{world}/no-model", "--output", "{out}/run"]
FAMILIES = ["real-data", "families", "--records", "{input}", "--output", "{out}/families.jsonl"]
INDEX = ["real-data", "index", "--corpus", "{input}", "--format", "check-covid", "--output", "{out}/cc.index"]
RETRIEVE = ["real-data", "retrieve", "--dataset", "check-covid", "--claims", "{input}", "--corpus",
            "{world}/corpus.json", "--index", "{world}/cc.index", "--output", "{out}/retrieved"]
STUDY_REPORT = ["fae", "study-report", "{world}/no-study", "--output", "{out}/report"]
COMPARE = ["fae", "compare", "{world}/no-run", "{world}/no-run", "--output", "{out}/compare"]

# (id, command, input builder, extra args, disk, exit code, message fragments, names allowed under out/)
# Rows with a disk condition, and those named in SUBPROCESS, run as real processes;
# the rest call the same entry point in-process (run_guarded is the whole top level).
SUBPROCESS = {"validate-gzip", "convert-latin1", "pairs-surrogate", "fae-run-utf16", "validate-keep-going-invalid"}
ROWS = [
    ("validate-latin1", VALIDATE, latin1, [], None, 2, ["in.jsonl:3:", "not valid UTF-8: byte 0xe9 at byte offset"], []),
    ("validate-utf16", VALIDATE, utf16, [], None, 2, ["in.jsonl:1:", "UTF-16", "iconv"], []),
    ("validate-gzip", VALIDATE, gzipped, [], None, 2, ["in.jsonl:1:", "gzip-compressed: decompress it first"], []),
    ("validate-dir", VALIDATE, directory, [], None, 2, ["is a directory, not a records file"], []),
    ("validate-surrogate", VALIDATE, surrogate, [], None, 2,
     ["in.jsonl:2: record 's1': field 'sentences[0].text'", "lone UTF-16 surrogate"], []),
    ("validate-bom", VALIDATE, utf8_bom, [], None, 0, ["2 valid records"], []),
    ("validate-deep", VALIDATE, deep_json, [], None, 2, ["in.jsonl:2:", "nested too deeply"], []),
    ("validate-huge-number", VALIDATE, huge_number, [], None, 2, ["in.jsonl:2:", "invalid JSON"], []),
    ("validate-keep-going-invalid", VALIDATE, many_bad, ["--keep-going"], None, 2, [], []),
    ("validate-keep-going-latin1", VALIDATE, latin1, ["--keep-going", "--report", "{out}/r.json"], None, 2,
     [], ["r.json"]),
    ("validate-keep-going-gzip", VALIDATE, gzipped, ["--keep-going"], None, 2, ["gzip-compressed"], []),
    ("validate-report-full-disk", VALIDATE, many_bad, ["--report", "{out}/r.json"], "full", 1, ["File too large"], []),
    ("validate-report-read-only", VALIDATE, many_bad, ["--report", "{out}/r.json"], "ro", 2, ["Permission denied"], []),
    ("convert-latin1", CONVERT, cc_latin1, [], None, 2, ["in.jsonl:3:", "not valid UTF-8: byte 0xe9"], []),
    ("convert-gzip", CONVERT, cc_gzip, [], None, 2, ["in.jsonl:1:", "gzip-compressed"], []),
    ("convert-dir", CONVERT, cc_dir, [], None, 2, ["is a directory"], []),
    ("convert-surrogate", CONVERT, cc_surrogate, [], None, 2, ["in.jsonl:1:", "lone UTF-16 surrogate"], []),
    ("convert-output-dir", CONVERT, cc_claims(3), ["--output", "{out}"], None, 2, ["is a directory"], []),
    ("convert-full-disk", CONVERT, cc_claims(), [], "full", 1, ["File too large"], []),
    ("convert-read-only", CONVERT, cc_claims(), [], "ro", 2, ["Permission denied"], []),
    ("pairs-latin1", PAIRS, latin1, [], None, 2, ["in.jsonl:3:", "not valid UTF-8"], []),
    ("pairs-utf16", PAIRS, utf16, [], None, 2, ["UTF-16"], []),
    ("pairs-dir", PAIRS, directory, [], None, 2, ["is a directory, not a records file"], []),
    ("pairs-surrogate", PAIRS, surrogate, [], None, 2, ["in.jsonl:2: record 's1'", "surrogate"], []),
    ("pairs-missing-enhanced", PAIRS, gold_only_second, ["--variant", "real"], None, 2,
     ["in.jsonl:2: record 'g1': field 'enhanced_evidence'", "2 of 3"], []),
    ("pairs-output-is-file", PAIRS, good, ["--output", "{world}/plain"], None, 2, ["is a file"], []),
    ("pairs-full-disk", PAIRS, good, [], "full", 1, ["File too large"], []),
    ("pairs-read-only", PAIRS, good, [], "ro", 2, ["Permission denied"], []),
    ("fae-run-gzip", FAE_RUN, gzipped, [], None, 2, ["in.jsonl:1:", "gzip-compressed"], []),
    ("fae-run-utf16", FAE_RUN, utf16, [], None, 2, ["UTF-16"], []),
    ("fae-run-latin1", FAE_RUN, latin1, [], None, 2, ["in.jsonl:3:", "not valid UTF-8"], []),
    ("fae-run-surrogate", FAE_RUN, surrogate, [], None, 2, ["in.jsonl:2: record 's1'", "surrogate"], []),
    ("fae-run-deep", FAE_RUN, deep_json, [], None, 2, ["in.jsonl:2:", "nested too deeply"], []),
    # a lone surrogate escape, in every command that reads JSON lines: the reader names file, line, field
    ("families-surrogate", FAMILIES, surrogate, [], None, 2,
     ["in.jsonl:2: record 's1': field 'sentences[0].text'", "lone UTF-16 surrogate"], []),
    ("index-surrogate", INDEX, cc_corpus_surrogate, [], None, 2,
     ["in.jsonl:2: field 'abstract[1]'", "lone UTF-16 surrogate"], []),
    ("retrieve-surrogate", RETRIEVE, cc_surrogate, [], None, 2, ["in.jsonl:1: field 'claim'", "lone UTF-16 surrogate"],
     []),
    # an output path under a file, and an output folder nobody may write: bad input, exit 2
    ("families-output-under-file", FAMILIES, good, ["--output", "{world}/plain/f.jsonl"], None, 2,
     ["plain: is a file, not a directory"], []),
    ("convert-output-under-file", CONVERT, cc_claims(3), ["--output", "{world}/plain/x/records.jsonl"], None, 2,
     ["plain: is a file, not a directory"], []),
    ("index-output-under-file", INDEX, cc_corpus, ["--output", "{world}/plain/cc.index"], None, 2,
     ["plain: is a file, not a directory"], []),
    ("families-read-only", FAMILIES, good, [], "ro", 2, ["Permission denied"], []),
    ("index-read-only", INDEX, cc_corpus, [], "ro", 2, ["Permission denied"], []),
    # numbers out of range: refused by the field's declared range, naming the flag
    ("study-report-negative-seed", STUDY_REPORT, good, ["--seed", "-5"], None, 2, ["--seed: must be >= 0, got -5"],
     []),
    ("study-report-no-draws", STUDY_REPORT, good, ["--draws", "0"], None, 2, ["--draws: must be >= 1, got 0"], []),
    ("study-report-huge-draws", STUDY_REPORT, good, ["--draws", "999999999999999"], None, 2,
     ["--draws: must be <= 1000000"], []),
    ("study-report-no-exploratory-draws", STUDY_REPORT, good, ["--exploratory-draws", "0"], None, 2,
     ["--exploratory-draws: must be >= 1, got 0"], []),
    ("study-report-huge-post-hoc-draws", STUDY_REPORT, good, ["--post-hoc-draws", "1000001"], None, 2,
     ["--post-hoc-draws: must be <= 1000000"], []),
    ("compare-negative-seed", COMPARE, good, ["--seed", "-1"], None, 2, ["--seed: must be >= 0, got -1"], []),
    ("families-huge-neighbours", FAMILIES, good, ["--neighbours", "99999999999999999999"], None, 2,
     ["--neighbours: must be <= 1000000"], []),
    # a YAML value refused by the run's own checks is named by the file and line it came from
    ("fae-run-yaml-device", ["fae", "run", "--config", "{input}"], run_yaml(), [], None, 2,
     ["in.jsonl:4: device: 'toaster' is not a device"], []),
]


@pytest.fixture(scope="module")
def world():
    """Inputs and outputs of every row, in one directory removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="hostile-"))
    root.chmod(0o755)
    _write(root / "corpus.json", json.dumps({"cord_id": "abc", "title": "t",
                                             "abstract": ["S0.", "S1.", "S2."]}) + "\n")
    plain_file(root / "plain")
    from data_prep.retrieval.index import build_index
    build_index(root / "corpus.json", "check-covid", root / "cc.index")
    hf = root / "hf"
    hf.mkdir()
    hf.chmod(0o777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _full_disk():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FULL_DISK_BYTES, FULL_DISK_BYTES))


def _without_dac_override():
    """Drop CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH from the bounding set before exec.

    Root then obeys permission bits like anyone else, so a 0555 directory is
    really read-only for the command (chmod alone does not stop root).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _read_only_preexec():
    return _without_dac_override if os.geteuid() == 0 else (lambda: None)


def _read_only_possible(world: Path) -> bool:
    """Whether a process we start is really refused a write into a 0555 directory."""
    ro = world / "ro-probe"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o555)
    try:
        probe = subprocess.run([sys.executable, "-c", f"open({str(ro / 'x')!r}, 'w')"],
                               preexec_fn=_read_only_preexec(), capture_output=True)
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        ro.chmod(0o755)
    return probe.returncode != 0 and "PermissionError" in probe.stderr.decode()


def run_in_process(argv: list[str], capsys) -> subprocess.CompletedProcess:
    from data_prep.cli import main as real_data
    from fae.cli import main as fae

    prog, *rest = argv
    capsys.readouterr()
    rc = {"real-data": real_data, "fae": fae}[prog](rest)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, rc, out.out, out.err)


def run_cli(argv: list[str], env_home: Path, preexec=None) -> subprocess.CompletedProcess:
    prog, *rest = argv
    module = {"real-data": "data_prep.cli", "fae": "fae.cli"}[prog]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(env_home), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1", "REAL_FAE_DEBUG": ""}
    return subprocess.run([sys.executable, "-m", module, *rest], capture_output=True, text=True,
                          env=env, preexec_fn=preexec, timeout=300, cwd=str(env_home))


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_hostile_input_gives_one_line_and_exit_code(world, row, capsys, monkeypatch):
    name, command, build, extra, disk, code, fragments, allowed = row
    case = world / name
    case.mkdir()
    case.chmod(0o755)
    out = case / "out"
    out.mkdir()
    inp = build(case / "in.jsonl")
    fmt = {"input": str(inp), "world": str(world), "out": str(out)}
    argv = [a.format(**fmt) for a in command] + [a.format(**fmt) for a in extra]
    preexec = None
    if disk == "full":
        preexec = _full_disk
    elif disk == "ro":
        if not _read_only_possible(world):
            pytest.skip("cannot make a directory read-only for a child process here")
        preexec = _read_only_preexec()
        out.chmod(0o555)

    if preexec is None and name not in SUBPROCESS:
        monkeypatch.delenv("REAL_FAE_DEBUG", raising=False)
        proc = run_in_process(argv, capsys)
    else:
        try:
            proc = run_cli(argv, world / "hf", preexec)
        finally:
            out.chmod(0o755)

    assert "Traceback" not in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode == code, proc.stderr
    message = proc.stderr if code else proc.stdout
    for frag in fragments:
        assert frag in message, message
    if code:  # one error line, last (progress bars of datasets may precede it)
        lines = proc.stderr.strip().splitlines()
        assert [i for i, line in enumerate(lines) if "error" in line] == [len(lines) - 1], proc.stderr
    # nothing partial (or temporary) is left under the output directory
    assert sorted(p.name for p in out.iterdir()) == sorted(allowed)


def test_validate_report_survives_closed_stdout(world):
    """`validate --keep-going --report r.json | head -1`: the report is written whatever stdout does."""
    case = world / "pipe"
    case.mkdir()
    inp = many_bad(case / "in.jsonl")
    _write(inp, inp.read_bytes() * 10)  # a summary far beyond the 64 KiB pipe buffer
    report = case / "r.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = (f"{sys.executable} -m data_prep.cli validate {inp} --keep-going --report {report} | head -1; "
           "exit ${PIPESTATUS[0]}")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=300)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.stdout.count("\n") == 1 and "4000 invalid" in proc.stdout
    assert json.loads(report.read_text())["invalid"] == 4000


# ---------------------------------------------------------------------------
# the one reader, the declared ranges, bounded work
# ---------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=5))
_json_value = st.recursive(_json_leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(st.text(min_size=1, max_size=4), kids, max_size=3)), max_leaves=12)


def _plant(value, steps, bad):
    """``value`` with the string ``bad`` put where ``steps`` lead (into a list or an object); its field path."""
    if not steps:
        return bad, ""
    step, rest = steps[0], steps[1:]
    if isinstance(value, list) and value:
        k = step % len(value)
        value[k], sub = _plant(value[k], rest, bad)
        return value, f"[{k}]{sub}"
    if isinstance(value, dict) and value:
        key = sorted(value)[step % len(value)]
        value[key], sub = _plant(value[key], rest, bad)
        return value, f".{key}{sub}"
    return bad, ""


@settings(max_examples=200, deadline=None)
@given(value=st.dictionaries(st.text(min_size=1, max_size=4), _json_value,
                             min_size=1, max_size=4),
       steps=st.lists(st.integers(0, 10), min_size=1, max_size=4),
       surrogate=st.integers(0xD800, 0xDFFF), prefix=st.text(max_size=3))
def test_the_reader_names_the_field_of_any_lone_surrogate(value, steps, surrogate, prefix):
    """Wherever a lone surrogate escape sits in a line, the one JSON-lines reader refuses that line naming the
    field's path; a line without one reads back as written."""
    from real_fae_core.jsonl import RecordError, iter_jsonl_lines

    clean = json.loads(json.dumps(value))
    planted, where = _plant(json.loads(json.dumps(value)), steps, prefix + chr(surrogate))
    if not isinstance(planted, dict):
        planted, where = {"x": planted}, ".x"
    expected = where[1:] if where.startswith(".") else where
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in.jsonl"
        path.write_text(json.dumps(clean) + "\n" + json.dumps(planted) + "\n", encoding="ascii")
        (ln1, first), (ln2, second) = list(iter_jsonl_lines(path))
    assert (ln1, first) == (1, clean)
    assert ln2 == 2 and isinstance(second, RecordError), second
    assert "lone UTF-16 surrogate" in second.reason
    assert second.field == expected, (second.field, expected)  # the path to the planted string


def test_every_draw_count_neighbour_count_and_bootstrap_seed_is_ranged():
    """Every command's bootstrap draws and neighbour count has a declared min and max, and every bootstrap seed
    (NumPy refuses a negative one) a min of 0: a mistyped number is one line, exit 2, before any work."""
    import dataclasses

    from command_walk import command_parsers

    seen = []
    for prog, (_module, cls, _parser) in sorted(command_parsers().items()):
        if cls is None:
            continue
        for f in dataclasses.fields(cls):
            if f.name in ("draws", "bootstrap", "neighbours") or f.name.endswith("_draws"):
                seen.append(f"{prog} {f.name}")
                assert "min" in f.metadata and "max" in f.metadata, f"{prog} --{f.name}: no declared range"
            if f.name == "seed" and any(f2.name in ("draws", "bootstrap") for f2 in dataclasses.fields(cls)):
                seen.append(f"{prog} {f.name}")
                assert f.metadata.get("min") == 0, f"{prog} --seed: a bootstrap seed needs min 0"
    assert {"fae study-report draws", "fae study-report exploratory_draws", "fae study-report post_hoc_draws",
            "fae study-report seed", "real-data families neighbours",
            "fae compare seed"} <= set(seen), seen


def _family_records(path: Path, words: int) -> Path:
    long = " ".join(f"word{i}" for i in range(words))
    rows = [make_record_dict(id="long", claim=long)] + [
        make_record_dict(id=f"r{i}", claim=f"word{i} word{i + 1} about other things") for i in range(5)]
    return _write(path, "".join(json.dumps(r) + "\n" for r in rows))


def test_families_time_grows_linearly_with_a_claims_length(tmp_path):
    """One claim of 150k distinct words: the near-duplicate search queries it in chunks (it took minutes,
    growing with the square of the length, as one FTS5 query)."""
    import time

    from data_prep.retrieval.families import FamilyOptions, build_families
    from data_prep.records import load_records

    records = load_records(_family_records(tmp_path / "in.jsonl", 150_000))
    start = time.monotonic()
    result = build_families(records, FamilyOptions())
    assert time.monotonic() - start < 25
    assert len(result.families) == 6


def test_a_long_sqlite_statement_stops_at_once_on_sigterm(tmp_path):
    """SIGTERM while SQLite runs one statement (an endless query here): exit 143 within a few seconds, one
    line, and the output never appears. Before, Python's handler waited for the statement to return."""
    import time

    script = tmp_path / "endless.py"
    script.write_text(
        "import sqlite3, sys\n"
        "from real_fae_core.entry import run_guarded\n"
        "from data_prep.retrieval.lexical import stoppable\n"
        "def main(argv):\n"
        "    con = sqlite3.connect(':memory:')\n"
        "    with stoppable(con):\n"
        "        print('ready', flush=True)\n"
        "        con.execute('WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) '\n"
        "                    'SELECT count(*) FROM c').fetchall()\n"
        "    open(argv[0], 'w').write('done')\n"
        "sys.exit(run_guarded('endless', main))\n")
    out = tmp_path / "out.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO), "REAL_FAE_DEBUG": ""}
    proc = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # inside the statement
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        _, err = proc.communicate(timeout=20)
        assert time.monotonic() - start < 5, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert err.strip() == "endless: terminated", err
    assert not out.exists()
