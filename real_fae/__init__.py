"""The Inspect AI namespace of this project: ``inspect eval real_fae/fae`` (docs/inspect.md).

Inspect names a task after the top-level package that defines it, so the task
lives here; everything it does is in :mod:`fae.harness.inspect_task`.
"""
