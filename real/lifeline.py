"""A launched training rank never outlives its launcher.

``accelerate launch`` and ``torchrun`` start each rank in a session of its own
(torch elastic's ``start_new_session``), so neither a signal sent to the
launcher's process group nor the launcher's death reaches the ranks. A launcher
killed outright (SIGKILL from a CI or test timeout, the OOM killer) used to
leave its ranks running without a parent: one blocked in a collective or in
the rendezvous store, asleep until the process-group timeout (``ddp_timeout``,
30 minutes by default) while holding the output directory's lock.

:func:`die_with_launcher` ties each launched rank to its parent: on Linux the
kernel sends SIGKILL when the parent dies (``PR_SET_PDEATHSIG``), elsewhere a
watchdog thread checks the parent every second. SIGKILL, not SIGTERM: a rank
blocked inside a C++ collective never runs a Python signal handler, nobody is
left to read what it would print, and what it holds goes with it (the run lock
is a ``flock`` the kernel releases). A launcher that is stopped normally
(Ctrl-C, SIGTERM) still stops its ranks itself, gracefully, before it exits.

Only launched processes are tied: a ``real-train`` started from a shell keeps
running when that shell exits (``nohup``), as any command does.
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
    """Tie this process to its parent when a launcher started it; say how ('' when not launched)."""
    if not launched():
        return ""
    parent = os.getppid()
    if sys.platform.startswith("linux") and _set_parent_death_signal(signal.SIGKILL):
        if os.getppid() != parent:  # it died between the two calls, before the kernel could tell us
            os._exit(1)
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
    os.kill(os.getpid(), signal.SIGKILL)
