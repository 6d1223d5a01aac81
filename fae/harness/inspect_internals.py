"""The two names of Inspect AI that the ``real_fae/fae`` task needs and Inspect does not export.

Every private import of another package's name is listed, with why, in docs/architecture.md
("Other packages' private names"); these two are imported here and nowhere else, so an Inspect
release that moves them fails this module's import (tests/test_inspect.py imports it first) rather
than a user's ``inspect eval``.

- :class:`PrerequisiteError` (``inspect_ai._util.error``): the exception ``inspect eval`` prints as
  one message without a traceback; the task raises it for bad input. No public module exports it.
- :func:`active_model` (``inspect_ai.model._model``): the model ``inspect eval`` loaded before making
  the task, or None when the task is made outside an eval. The public ``inspect_ai.model.get_model()``
  differs where it matters here: with no active model it falls back to ``INSPECT_EVAL_MODEL`` or
  raises, where the task wants None (nothing to check yet).
"""

from __future__ import annotations

from inspect_ai._util.error import PrerequisiteError
from inspect_ai.model._model import active_model

__all__ = ["PrerequisiteError", "active_model"]
