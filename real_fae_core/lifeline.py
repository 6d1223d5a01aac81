"""A launched training rank never outlives its launcher, never waits without bound for a rank that
has gone, and leaves within seconds of its last step.

``accelerate launch`` (two or more processes) and ``torchrun`` start each rank
in a session of its own (torch elastic's ``start_new_session``), so neither a
signal sent to the launcher's process group (Ctrl-C, ``killpg``) nor the
launcher's death reaches the ranks. Left alone, a launcher killed outright
(SIGKILL from a CI or test timeout, the OOM killer) leaves its ranks running
without a parent: one blocked in a collective or in the rendezvous store,
asleep until the process-group timeout (``ddp_timeout``, 30 minutes by default)
while holding the output directory's lock.

:func:`die_with_launcher` ties such a rank to its launcher: on Linux the kernel
sends it SIGTERM when the launcher dies (``PR_SET_PDEATHSIG``), elsewhere a
watchdog thread checks the parent every second. SIGTERM is enough: a rank whose
launcher is gone ends at once (:func:`answer_sigterm`), even inside a C++
collective, and the run lock, a ``flock``, goes with it; a one-process run stops
cleanly and says what it kept. A launcher stopped normally (Ctrl-C, SIGTERM)
still stops its ranks itself first.

:func:`answer_sigterm` decides what SIGTERM means to a rank of a multi-process
run. torch elastic sends it to every survivor as soon as one rank *fails*: the
survivor's collective fails at the same moment, and the error that names the
lost peer and the checkpoint kept must win the race against SIGTERM's default
action (which can end the rank silently first). So a SIGTERM that
finds a sibling rank gone is left to that error; one sent to stop the run
(Ctrl-C on the launcher) raises :class:`~real_fae_core.errors.Terminated` like
Ctrl-C does. A stopped rank can leave before a busy sibling has even taken the
same SIGTERM (they are sent a moment apart, and two cores may not run both at
once), so a rank that reads its SIGTERM as a stop leaves a mark first
(:func:`mark_stop`): a sibling that finds it gone *and* marked knows the run is
being stopped, not failing. Either way a rank still alive
``REAL_TRAIN_TERM_SECONDS`` later (blocked in C++, where no Python handler
runs) is ended by a thread that reads Python's signal wake-up pipe, with one
line saying why.

A process in its launcher's own process group (accelerate's one-process
launcher, DeepSpeed's) is not tied: every signal to that group reaches it
directly, it waits for no peer, and Ctrl-C must leave it time to say what it
kept. A ``real-train`` started from a shell is never tied (``nohup`` works).

:func:`watch_peers` covers the case no launcher handles: torch elastic (and so
``accelerate launch``) stops the other ranks when one *fails*, but when one rank
exits 0 it waits for the rest for ever. A rank whose sibling has exited and that
is still alive ``grace`` seconds later (:data:`PEER_GRACE_ENV`) prints its
threads' stacks and one line naming the rank that left and what this one was
still doing (:func:`set_stage`), and ends.

:func:`leave` is how a launched rank exits: its non-daemon threads and
``atexit`` work get a bounded time (:data:`EXIT_CEILING_ENV`), it says that it
exited, and it ends with ``os._exit`` instead of running the interpreter's
teardown. That teardown is where multi-process runs hung or aborted after a
successful training: C++ destructors of torch's process-group and DeepSpeed's
objects run after Python has stopped, when a peer is gone, and one blocked in a
futex for ever (the rank of a finished DDP run) or called ``std::terminate``
(``terminate called without an active exception`` after a ZeRO-3 run). Nothing
of the run is lost by skipping it: every output file is written and closed
(atomically) before :func:`leave`, and the ``atexit`` handlers (logging, trackers)
still run.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from real_fae_core.entry import interrupt_note, say_line
from real_fae_core.errors import Terminated

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PEER_GRACE_ENV = "REAL_TRAIN_PEER_GRACE"  # seconds a rank may outlive a sibling that exited (default 60)
TERM_GRACE_ENV = "REAL_TRAIN_TERM_SECONDS"  # seconds a rank may take to stop after SIGTERM (default 10)
DEFAULT_TERM_GRACE = 10.0
EXIT_CEILING_ENV = "REAL_TRAIN_EXIT_SECONDS"  # seconds a finished rank may take to exit (default 30)
DEFAULT_PEER_GRACE = 60.0
DEFAULT_EXIT_CEILING = 30.0

_stage = "starting"


def launched() -> bool:
    """True in a process started by a launcher: torchrun / ``accelerate launch`` ranks (torch elastic),
    DeepSpeed's launcher (``LOCAL_RANK``), or accelerate's one-process launcher."""
    return any(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION"))


def die_with_launcher() -> str:
    """Tie this process to its launcher when signals to the launcher's process group cannot reach it.

    Returns how: ``"pdeathsig"``, ``"watchdog"``, or ``""`` (not tied).
    """
    if not launched():
        return ""
    parent = os.getppid()
    try:
        own_group = os.getpgid(0) != os.getpgid(parent)
    except OSError:  # the parent is already gone
        own_group = True
    if not own_group:
        return ""
    if sys.platform.startswith("linux") and _set_parent_death_signal(signal.SIGTERM):
        if os.getppid() != parent:  # it died between the two calls, before the kernel could tell us
            os.kill(os.getpid(), signal.SIGTERM)
        return "pdeathsig"
    threading.Thread(target=_watch_parent, args=(parent,), name="die-with-launcher", daemon=True).start()
    return "watchdog"


def _set_parent_death_signal(sig: int) -> bool:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, period: float = 1.0) -> None:
    while os.getppid() == parent:
        time.sleep(period)
    os.kill(os.getpid(), signal.SIGTERM)


# ----------------------------------------------------------------- stage, rank

def set_stage(text: str) -> None:
    """Say what this rank is doing now; the line that ends a stuck rank names it."""
    global _stage
    _stage = text


def stage() -> str:
    """What this rank said it is doing (:func:`set_stage`); the line that ends a stuck rank quotes it."""
    return _stage


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of ranks, from the launcher's environment ((0, 1) outside one)."""
    def number(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default
    return number("RANK", 0), number("WORLD_SIZE", 1)


def _seconds(env: str, default: float) -> float:
    try:
        value = float(os.environ.get(env, default))
    except ValueError:
        return default
    return value if value > 0 else default


def _say(prog: str, text: str) -> None:
    rank, world = rank_and_world()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    say_line(f"{prog}: rank {rank} of {world}: {text}")


# ----------------------------------------------------------------- the peer watch

def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` (field 22 of /proc/PID/stat), so a reused pid is not taken for the old process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # exited, not yet reaped by the launcher: gone all the same
        return None
    return fields[19]


def sibling_ranks(parent: int) -> dict[int, tuple[int, str, int]]:
    """The other ranks of this launch alive now, by local rank: (pid, start time, global rank).

    They are the launcher's other children whose environment carries a rank of the same run.
    """
    mine = os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("MASTER_PORT")
    found = {}
    try:
        tasks = list(Path(f"/proc/{parent}/task").iterdir())
    except OSError:
        return found
    children = set()
    for task in tasks:
        try:
            children.update(int(pid) for pid in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    for pid in children - {os.getpid()}:
        try:
            env = dict(item.split("=", 1) for item in
                       Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0") if "=" in item)
            local, rank = int(env["LOCAL_RANK"]), int(env["RANK"])
        except (OSError, KeyError, ValueError):
            continue
        start = _process_start(pid)
        if start is not None and (env.get("TORCHELASTIC_RUN_ID"), env.get("MASTER_PORT")) == mine:
            found[local] = (pid, start, rank)
    return found


def watch_peers(prog: str, grace: float | None = None, period: float = 1.0, startup: float = 10.0) -> bool:
    """End this rank ``grace`` seconds after a sibling rank of the same launch exited, if it is still alive.

    Siblings are the ranks on this machine (``LOCAL_WORLD_SIZE``), found through /proc as the launcher's
    other children: Linux only, a no-op outside a launched multi-process run. A sibling never seen alive
    within ``startup`` seconds counts as exited from then on. Returns whether the watch runs.
    """
    _, world = rank_and_world()
    try:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    except ValueError:
        return False
    if not launched() or local_world < 2 or not sys.platform.startswith("linux"):
        return False
    grace = _seconds(PEER_GRACE_ENV, DEFAULT_PEER_GRACE) if grace is None else grace
    expected = set(range(local_world)) - {local_rank}
    parent = os.getppid()
    known = sibling_ranks(parent)  # at once: a sibling that exits early is still seen alive once
    threading.Thread(target=_watch_peers, args=(prog, parent, expected, known, grace, period, startup),
                     name="peer-watch", daemon=True).start()
    return True


def _watch_peers(prog: str, parent: int, expected: set[int], known: dict, grace: float, period: float,
                 startup: float) -> None:
    started = time.monotonic()
    my_local = int(os.environ.get("LOCAL_RANK", 0))
    gone: dict[int, float] = {}
    while os.getppid() == parent:
        time.sleep(period)
        for local, entry in sibling_ranks(parent).items():
            known.setdefault(local, entry)
        now = time.monotonic()
        for local in expected - gone.keys():
            if local in known:
                pid, start, _ = known[local]
                if _process_start(pid) != start:
                    gone[local] = now
            elif now - started >= startup:
                gone[local] = now
        if gone:
            local, since = min(gone.items(), key=lambda item: item[1])
            if now - since >= grace:
                # torch elastic numbers a machine's ranks contiguously: a sibling never seen has this rank
                peer = known[local][2] if local in known else rank_and_world()[0] - my_local + local
                _end_stuck(prog, peer, now - since)


def _end_stuck(prog: str, peer: int, seconds: float) -> None:
    """This rank outlived a sibling by the grace period: its stacks, one line, and the end."""
    print(f"{prog}: threads of the stuck rank (rank {rank_and_world()[0]}):", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    _say(prog, f"ended: rank {peer} exited {seconds:.0f} s ago and this rank was still {_stage} "
               f"(its threads' stacks are above; {PEER_GRACE_ENV} sets the grace period)")
    os._exit(1)


# ----------------------------------------------------------------- what SIGTERM means

_term_lock = threading.Lock()
_term_reason: str | None = None  # "peer", "launcher" or "stop", fixed by the first SIGTERM
_leaving = False  # set by leave(): its own ceiling bounds the rest
_term_parent: int | None = None  # the launcher, once answer_sigterm() is installed


def answer_sigterm(prog: str, grace: float | None = None) -> bool:
    """Make SIGTERM end this rank of a multi-process launch with one line that says why (see the module doc).

    Call it from the main thread, before the training starts. Returns whether it was installed: only in a
    launched run of two or more processes (a one-process run keeps ``run_guarded``'s handling).
    """
    if not launched() or rank_and_world()[1] < 2 or threading.current_thread() is not threading.main_thread():
        return False
    global _term_parent
    grace = _seconds(TERM_GRACE_ENV, DEFAULT_TERM_GRACE) if grace is None else grace
    parent = _term_parent = os.getppid()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, lambda signum, frame: _on_sigterm(parent))
    except (ValueError, OSError):  # pragma: no cover - an embedding that owns the signals
        os.close(read_end)
        os.close(write_end)
        return False
    threading.Thread(target=_watch_sigterm, args=(prog, parent, read_end, grace), name="sigterm-watch",
                     daemon=True).start()
    return True


def sigterm_reason(parent: int | None = None) -> str | None:
    """Why SIGTERM came, once it has: ``"launcher"`` (it is gone), ``"peer"`` (a sibling rank is gone, so
    torch elastic is stopping the run after a failure) or ``"stop"`` (the run is being stopped); None before."""
    global _term_reason
    with _term_lock:
        if _term_reason is None and parent is not None:
            if os.getppid() != parent:
                _term_reason = "launcher"
            else:
                try:
                    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", rank_and_world()[1]))
                except ValueError:
                    local_world = 1
                alive = len(sibling_ranks(parent)) if sys.platform.startswith("linux") else local_world - 1
                _term_reason = "peer" if alive < local_world - 1 and not stop_marked(parent) else "stop"
                if _term_reason == "stop":
                    mark_stop(parent)
        return _term_reason


def stop_marks_dir() -> Path:
    """Where stopped ranks leave their marks: one directory per user, empty files named by launch and rank."""
    return Path(tempfile.gettempdir()) / f"real-fae-stops-{os.getuid() if hasattr(os, 'getuid') else 0}"


def launch_key(parent: int) -> str | None:
    """This launch, as the launcher's pid and start time (a reused pid is another launch)."""
    start = _process_start(parent)
    return None if start is None else f"{parent}-{start}"


def mark_stop(parent: int) -> None:
    """Leave a mark, before this rank goes, that it was stopped (not failing); marks of launches gone are removed."""
    key = launch_key(parent)
    if key is None:
        return
    marks = stop_marks_dir()
    try:
        marks.mkdir(mode=0o700, exist_ok=True)
        for old in marks.iterdir():
            pid, _, start = old.name.partition("-")
            if pid.isdigit() and launch_key(int(pid)) != f"{pid}-{start.rsplit('-', 1)[0]}":
                old.unlink(missing_ok=True)
        (marks / f"{key}-{os.environ.get('LOCAL_RANK', '0')}").touch()
    except OSError:  # a mark is a courtesy to the siblings: without it they say "another process stopped"
        pass


def stop_marked(parent: int) -> bool:
    """Whether a sibling of this launch read its SIGTERM as a stop before it left."""
    key = launch_key(parent)
    try:
        return key is not None and any(m.name.startswith(f"{key}-") for m in stop_marks_dir().iterdir())
    except OSError:
        return False


def run_stopping() -> bool:
    """Whether this run is being stopped: SIGTERM came here as a stop, or a sibling rank read its own so
    before it left. A collective that fails because such a sibling left is the stop, not a failure, even
    when this rank's own SIGTERM has not been taken yet."""
    return sigterm_reason() == "stop" or (_term_parent is not None and stop_marked(_term_parent))


def _on_sigterm(parent: int) -> None:
    """The main thread's handler: a stop raises Terminated; a lost peer is left to the failing collective."""
    if sigterm_reason(parent) == "stop":
        raise Terminated()


def _watch_sigterm(prog: str, parent: int, read_end: int, grace: float) -> None:
    while True:
        try:
            data = os.read(read_end, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data:
            break
    reason = sigterm_reason(parent)
    if reason != "launcher":
        time.sleep(grace)  # the main thread says it better, with the checkpoint kept: give it the time
        if _leaving:  # it did, and is leaving within leave()'s own ceiling
            return
    _end_terminated(prog, reason, grace)


def _end_terminated(prog: str, reason: str | None, grace: float) -> None:
    note = interrupt_note()
    tail = f"; {note}" if note else ""
    if reason == "peer":
        _say(prog, f"error: another process of this run stopped while this rank was {_stage}; see its error"
                   f"{tail}")
        os._exit(1)
    if reason == "launcher":
        _say(prog, f"terminated: its launcher is gone{tail}")
    else:
        _say(prog, f"terminated: still {_stage} {grace:.0f} s after SIGTERM ({TERM_GRACE_ENV} sets this limit)"
                   f"{tail}")
    os._exit(143)


# ----------------------------------------------------------------- a bounded exit

def leave(prog: str, code: int, ceiling: float | None = None) -> None:
    """Exit this launched rank with ``code`` within ``ceiling`` seconds, saying so; never returns.

    Non-daemon threads are joined and ``atexit`` handlers run within the ceiling; past it the rank prints
    its threads' stacks and one line naming what it was still doing, and exits 1. Then ``os._exit``: the
    interpreter's and the C++ libraries' teardown, where finished runs hung or aborted, does not run.
    """
    global _leaving
    _leaving = True
    ceiling = _seconds(EXIT_CEILING_ENV, DEFAULT_EXIT_CEILING) if ceiling is None else ceiling
    started = time.monotonic()
    threading.Thread(target=_watch_exit, args=(prog, ceiling), name="exit-watch", daemon=True).start()
    # the last resort, should the watch above never get the interpreter's lock back: stacks, then exit 1
    faulthandler.dump_traceback_later(ceiling + 5, exit=True, file=sys.stderr)
    deadline = started + ceiling / 2
    left = []
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        set_stage(f"exiting: waiting for its thread {thread.name!r} to finish")
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread.name)
    if left:
        _say(prog, f"leaving without thread(s) {', '.join(left)}, still running after {ceiling / 2:.0f} s")
    set_stage("exiting: running the atexit handlers")
    atexit._run_exitfuncs()
    if rank_and_world()[1] > 1:
        how = "cleanly" if code == 0 else "after an error"
        _say(prog, f"exited {how} (exit code {code}, {time.monotonic() - started:.1f} s to leave)")
    else:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(code)


def _watch_exit(prog: str, ceiling: float) -> None:
    time.sleep(ceiling)
    print(f"{prog}: threads of the stuck rank (rank {rank_and_world()[0]}):", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    _say(prog, f"ended: still {_stage} {ceiling:.0f} s after its work finished (its threads' stacks are above; "
               f"{EXIT_CEILING_ENV} sets this limit)")
    os._exit(1)
