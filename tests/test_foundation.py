"""The shared core every command relies on: error handler, run lock, secret scrubbing, strict YAML."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from real_fae_core.entry import run_guarded, set_interrupt_note
from real_fae_core.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    RunFailure,
    UserError,
)
from real_fae_core.runlock import RunLock, lock_path_for
from real_fae_core.secrets import register_secret, scrub
from real_fae_core.yamlio import load_yaml, parse_yaml

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ---------------------------------------------------------------------------
# run_guarded: one line and a documented exit code for every way a command fails
# ---------------------------------------------------------------------------


def _raiser(exc):
    def fn(argv):
        raise exc
    return fn


@pytest.mark.parametrize("exc, code, fragment", [
    (UserError("bad value for --rounds"), EXIT_USAGE, "prog: error: bad value for --rounds"),
    (RunFailure("server gone"), EXIT_FAILURE, "prog: error: server gone"),
    (FileNotFoundError(2, "No such file or directory", "/x/y.jsonl"), EXIT_FAILURE,
     "prog: error: /x/y.jsonl: No such file or directory"),
    (OSError(28, "No space left on device", "/out/claims.jsonl"), EXIT_FAILURE, "No space left on device"),
    # a path of the user's that cannot be used as asked is bad input, not a failing disk
    (PermissionError(13, "Permission denied", "/ro/out.jsonl"), EXIT_USAGE,
     "prog: error: /ro/out.jsonl: Permission denied (choose a folder you can write"),
    (OSError(30, "Read-only file system", "/mnt/out"), EXIT_USAGE, "/mnt/out: Read-only file system"),
    (IsADirectoryError(21, "Is a directory", "/tmp"), EXIT_USAGE, "/tmp: Is a directory"),
    (ValueError("boom"), EXIT_FAILURE, "prog: internal error: ValueError: boom"),
    (KeyboardInterrupt(), EXIT_INTERRUPTED, "prog: interrupted"),
])
def test_every_failure_is_one_line_with_its_exit_code(exc, code, fragment, capsys):
    assert run_guarded("prog", _raiser(exc), []) == code
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and err.count("\n") == 1


def test_success_usage_and_help_codes(capsys):
    assert run_guarded("prog", lambda argv: None, []) == EXIT_OK
    assert run_guarded("prog", lambda argv: 3, []) == 3

    def parse(argv):
        import argparse
        p = argparse.ArgumentParser(allow_abbrev=False, prog="prog")
        p.add_argument("--n", type=int)
        p.parse_args(argv)

    assert run_guarded("prog", parse, ["--n", "x"]) == EXIT_USAGE
    assert run_guarded("prog", parse, ["--help"]) == EXIT_OK


def test_interrupt_note_says_what_was_kept(capsys):
    def fn(argv):
        set_interrupt_note("12 claims kept in runs/a; rerun the same command to resume")
        raise KeyboardInterrupt

    assert run_guarded("fae run", fn, []) == EXIT_INTERRUPTED
    assert "fae run: interrupted; 12 claims kept in runs/a" in capsys.readouterr().err
    # the note does not leak into the next command
    assert run_guarded("fae run", _raiser(KeyboardInterrupt()), []) == EXIT_INTERRUPTED
    assert "kept" not in capsys.readouterr().err


def test_debug_shows_the_traceback(monkeypatch):
    with pytest.raises(ValueError):
        run_guarded("prog", _raiser(ValueError("boom")), ["--debug"])
    monkeypatch.setenv("REAL_FAE_DEBUG", "1")
    with pytest.raises(UserError):
        run_guarded("prog", _raiser(UserError("x")), [])


def test_debug_flag_is_removed_before_the_command_sees_argv():
    seen = []
    assert run_guarded("prog", lambda argv: seen.extend(argv), ["a", "--debug", "b"]) == EXIT_OK
    assert seen == ["a", "b"]


def test_error_messages_are_scrubbed_of_registered_secrets(capsys):
    register_secret("sk-test-foundation-0123")
    assert run_guarded("prog", _raiser(RunFailure("HTTP 401: bad key sk-test-foundation-0123")), []) == 1
    first = capsys.readouterr().err
    assert "bad key ***" in first and "sk-test-foundation-0123" not in first
    assert run_guarded("prog", _raiser(RuntimeError("echo: Authorization: Bearer sk-test-foundation-0123")), []) == 1
    second = capsys.readouterr().err
    assert "sk-test-foundation-0123" not in second and "Bearer ***" in second


def test_sigterm_runs_finally_blocks_and_exits_143(tmp_path):
    marker = tmp_path / "flushed"
    script = textwrap.dedent(f"""
        import sys, time
        from real_fae_core.entry import run_guarded, set_interrupt_note
        def body(argv):
            set_interrupt_note("3 claims kept")
            try:
                print("ready", flush=True)
                time.sleep(60)
            finally:
                open({str(marker)!r}, "w").write("yes")
        sys.exit(run_guarded("demo-cmd", body, []))
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_env())
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == EXIT_TERMINATED
    assert marker.read_text() == "yes"
    assert "demo-cmd: terminated; 3 claims kept" in err and "Traceback" not in err


def test_sigterm_keeps_its_default_action_in_a_multi_process_run():
    """A rank stuck in a collective never returns to Python: only the default action ends it."""
    script = textwrap.dedent("""
        import sys, time
        from real_fae_core.entry import run_guarded
        def body(argv):
            print("ready", flush=True)
            time.sleep(60)
        sys.exit(run_guarded("rank", body, []))
    """)
    env = _env() | {"WORLD_SIZE": "2"}
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGTERM


def test_broken_pipe_on_stdout_is_quiet(tmp_path):
    script = textwrap.dedent("""
        import sys
        from real_fae_core.entry import run_guarded
        def body(argv):
            for k in range(200000):
                print("line", k)
        sys.exit(run_guarded("lister", body, []))
    """)
    p = subprocess.run(f"{sys.executable} -c '{script}' | head -1", shell=True, capture_output=True, text=True,
                       env=_env(), timeout=60)
    assert p.stdout == "line 0\n"
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


# ---------------------------------------------------------------------------
# RunLock: one writer per output, dead holders taken over
# ---------------------------------------------------------------------------

_HOLDER = textwrap.dedent("""
    import sys, time
    from real_fae_core.runlock import RunLock
    lock = RunLock(sys.argv[1], "fae run --output x").acquire()
    print("locked", flush=True)
    time.sleep(120)
""")


def test_second_writer_is_refused_naming_the_holder_and_a_dead_holder_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env=_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError) as err:
            RunLock(run_dir, "fae run").acquire()
        msg = str(err.value)
        assert f"pid {holder.pid}" in msg and "fae run --output x" in msg and "host" in msg and "since" in msg
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with RunLock(run_dir, "fae run") as lock:  # the dead holder's lock is free again
        assert lock.held
        assert f'"pid": {os.getpid()}' in lock.path.read_text()
    assert not lock.held


def test_lock_of_a_file_lies_beside_it_and_disabled_locks_do_nothing(tmp_path):
    out = tmp_path / "enhanced.jsonl"
    assert lock_path_for(out, is_dir=False) == tmp_path / "enhanced.jsonl.lock"
    assert lock_path_for(tmp_path) == tmp_path / ".lock"
    with RunLock(out, "real-data enhance", is_dir=False):
        with pytest.raises(UserError, match="in use by real-data enhance"):
            # flock is per open file description: a second acquire in the same process conflicts too
            RunLock(out, "real-data enhance", is_dir=False).acquire()
        assert not RunLock(out, "x", is_dir=False, enabled=False).acquire().held


def test_lock_is_released_between_sequential_runs(tmp_path):
    for _ in range(3):
        with RunLock(tmp_path / "r", "fae run") as lock:
            assert lock.held
            with pytest.raises(UserError, match="in use by fae run"):
                RunLock(tmp_path / "r", "fae run").acquire()
        assert not lock.held
    RunLock(tmp_path / "r", "fae run").acquire().release()  # the next run takes it


# ---------------------------------------------------------------------------
# secrets
# ---------------------------------------------------------------------------


def test_scrub_masks_registered_keys_and_bearer_shapes():
    register_secret("abcd-registered-key-42")
    text = ('{"error": {"message": "Incorrect API key provided: abcd-registered-key-42", '
            '"headers": {"Authorization": "Bearer other-unregistered-9f"}, "api_key": "zz-top"}}')
    out = scrub(text)
    assert "abcd-registered-key-42" not in out and "other-unregistered-9f" not in out and "zz-top" not in out
    assert "Incorrect API key provided" in out  # the useful part stays
    assert scrub("no secrets here: rounds=4") == "no secrets here: rounds=4"


def test_short_values_are_not_registered_so_words_survive():
    register_secret("a")
    assert scrub("a label") == "a label"


# ---------------------------------------------------------------------------
# strict YAML
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text, fragment", [
    ("learning_rate: 1.0e-4\nlora_r: 16\nlearning_rate: 5.0\n", "r.yaml:3: key 'learning_rate' is given twice (lines 1 and 3)"),
    ("a:\n  b: 1\n  b: 2\n", "r.yaml:3: key 'b' is given twice (lines 2 and 3)"),
    ("a: [1, 2\n", "r.yaml:2:"),
])
def test_yaml_errors_name_line_and_key(text, fragment):
    with pytest.raises(UserError) as err:
        parse_yaml(text, "r.yaml")
    assert fragment in str(err.value)


def test_yaml_same_key_in_sibling_mappings_is_fine():
    assert parse_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}


def test_yaml_file_kinds(tmp_path):
    with pytest.raises(UserError, match="is a directory"):
        load_yaml(tmp_path)
    with pytest.raises(UserError, match="not found"):
        load_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("model: caf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        load_yaml(bad)
    good = tmp_path / "ok.yaml"
    good.write_text("rounds: 4\n", encoding="utf-8")
    assert load_yaml(good) == {"rounds": 4}
