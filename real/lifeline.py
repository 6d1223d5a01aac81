"""A launched training rank never outlives its launcher.

``accelerate launch`` (two or more processes) and ``torchrun`` start each rank
in a session of its own (torch elastic's ``start_new_session``), so neither a
signal sent to the launcher's process group (Ctrl-C, ``killpg``) nor the
launcher's death reaches the ranks. A launcher killed outright (SIGKILL from a
CI or test timeout, the OOM killer) used to leave its ranks running without a
parent: one blocked in a collective or in the rendezvous store, asleep until
the process-group timeout (``ddp_timeout``, 30 minutes by default) while
holding the output directory's lock.

:func:`die_with_launcher` ties such a rank to its launcher: on Linux the kernel
sends it SIGTERM when the launcher dies (``PR_SET_PDEATHSIG``), elsewhere a
watchdog thread checks the parent every second. SIGTERM is enough: in a
multi-process run the rank keeps SIGTERM's default action (``run_guarded``), so
it ends at once even inside a C++ collective, and the run lock, a ``flock``,
goes with it; a one-process run stops cleanly and says what it kept. A launcher
stopped normally (Ctrl-C, SIGTERM) still stops its ranks itself first.

A process in its launcher's own process group (accelerate's one-process
launcher, DeepSpeed's) is not tied: every signal to that group reaches it
directly, it waits for no peer, and Ctrl-C must leave it time to say what it
kept. A ``real-train`` started from a shell is never tied (``nohup`` works).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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
