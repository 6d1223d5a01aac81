"""`fae --help` must stay fast: building the parser imports every subcommand
module, so a heavy top-level import there (scipy, torch, ...) taxes every
`fae` command by seconds. Heavy libraries belong inside the functions that use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("scipy", "torch", "matplotlib", "transformers")

_PROBE = """
import json, sys
from {module} import main
try:
    main({argv!r})
except SystemExit:
    pass
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)), file=sys.stderr)
"""


def _heavy_after(module: str, argv: list[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    code = _PROBE.format(module=module, argv=argv, heavy=heavy)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "REAL_FAE_DEBUG": ""}, timeout=120)
    assert "usage" in proc.stdout.lower(), proc.stdout + proc.stderr
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["compare", "--help"], ["pave", "--help"]])
def test_fae_help_imports_no_heavy_library(argv):
    assert _heavy_after("fae.cli", argv) == []


@pytest.mark.parametrize("command", ["run", "checkpoints"])
def test_fae_run_help_imports_only_its_parser(command):
    """`fae run` (and `fae checkpoints`, which takes its options) is built by the one generator
    (real_fae_core.command.add_config_arguments): no transformers, torch or trl to show or parse its options."""
    assert _heavy_after("fae.cli", [command, "--help"], heavy=(*HEAVY, "trl")) == []


def test_real_data_help_imports_no_heavy_library():
    assert _heavy_after("data_prep.cli", ["--help"]) == []


def test_real_data_help_does_not_load_the_openai_client():
    """Only `real-data enhance` talks to servers; the openai package alone costs ~1 s at import."""
    assert _heavy_after("data_prep.cli", ["--help"], heavy=("openai",)) == []


def test_fae_help_does_not_build_the_run_options_parser():
    """`fae` never imports trl or transformers to list its commands."""
    assert _heavy_after("fae.cli", ["--help"], heavy=("trl", "transformers")) == []
