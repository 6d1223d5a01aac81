"""Progress bars only on a terminal: the one decision, for our own bars and the libraries'.

A tqdm bar redraws itself with ``\\r``; in a log file or a pipe every redraw stays,
so a log fills with half-drawn lines. :func:`show_progress` says whether stderr is
a terminal; :func:`progress_bar` is the tqdm every command of ours uses (off
where :func:`show_progress` is false, and where ``--no-progress`` turned it
off); :func:`quiet_library_bars`, called once by every entry point
(:func:`real_fae_core.entry.run_guarded`), turns off the bars of datasets
(``map``, ``save_to_disk``), huggingface_hub and transformers (weight loading)
when stderr is not a terminal, in this process and in the processes it starts
(their environment), e.g. the ranks of ``accelerate launch``. Trainer's own bar
follows the same decision through ``disable_tqdm`` (real.training.args).
"""

from __future__ import annotations

import os
import sys

# Read by the libraries when they are imported (datasets.config, huggingface_hub.constants; transformers'
# bars follow huggingface_hub's), so they reach the processes we start too.
LIBRARY_ENV = ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS")


def show_progress(stream=None) -> bool:
    """True when ``stream`` (default: stderr, where every bar of ours goes) is a terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False


def progress_bar(iterable=None, *, enabled: bool = True, **kwargs):
    """``tqdm(iterable, **kwargs)`` drawn on stderr only where :func:`show_progress` and ``enabled``
    (``--no-progress`` passes False); elsewhere a silent bar that still counts and iterates."""
    from tqdm.auto import tqdm

    kwargs.setdefault("file", sys.stderr)
    return tqdm(iterable, disable=not (enabled and show_progress(kwargs["file"])), **kwargs)


def quiet_library_bars(stream=None) -> bool:
    """Where ``stream`` (stderr) is not a terminal: no progress bars from datasets, huggingface_hub and
    transformers, now (already imported) and later (imported afterwards, or in a process started from
    here). A variable the user set is kept. Returns :func:`show_progress`."""
    if show_progress(stream):
        return True
    for name in LIBRARY_ENV:
        os.environ.setdefault(name, "1")
    if "datasets" in sys.modules:
        from datasets.utils import disable_progress_bars

        disable_progress_bars()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars as hub_disable

        hub_disable()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return False
