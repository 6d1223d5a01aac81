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


def test_fae_run_help_imports_only_its_parser():
    """`fae run` parses with transformers' HfArgumentParser: it may import transformers, never torch or trl."""
    assert _heavy_after("fae.cli", ["run", "--help"], heavy=(*HEAVY, "trl")) == ["transformers"]


def test_real_data_help_imports_no_heavy_library():
    assert _heavy_after("data_prep.cli", ["--help"]) == []


def test_real_data_help_does_not_load_the_openai_client():
    """Only `real-data enhance` talks to servers; the openai package alone costs ~1 s at import."""
    assert _heavy_after("data_prep.cli", ["--help"], heavy=("openai",)) == []


def test_fae_help_does_not_build_the_run_options_parser():
    """Only `fae run` itself may pay for importing its parser (transformers); `fae` never imports trl."""
    assert _heavy_after("fae.cli", ["--help"], heavy=("trl", "transformers")) == []
