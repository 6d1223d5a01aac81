"""`fae pave --records FILE --model M --output DIR`: the command line of PAVE (SPEC §9).

The parser is generated from the fields of :class:`~fae.pave.runner.PaveConfig`; what PAVE samples, computes
and writes is :mod:`fae.pave.runner`.
"""

from __future__ import annotations

import argparse

from real_fae_core.command import add_config_arguments, field_names
from fae.pave.runner import (HF_FIELDS, OPENAI_FIELDS, VLLM_FIELDS,  # noqa: F401 - the backends' flags, by name
                             PaveConfig, PaveFields, PaveHFFields)
from fae.pave.runner import run  # noqa: F401 - the command's run(config), for the dispatcher
from fae.backends.options import HFLoadFields, OpenAIServingFields, VLLMServingFields

CONFIG = PaveConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    # PAVE's own options, then the backends' own, declared from their dataclasses as `fae run` has them, each
    # backend's under its heading (their fields' `group`); PAVE's --seed seeds each prompt's samples itself,
    # and it reads no label probabilities from the FAE backends.
    add_config_arguments(p, PaveConfig, field_names(PaveFields, PaveHFFields, HFLoadFields, VLLMServingFields,
                                                    OpenAIServingFields))
