"""`fae pave --records FILE --model M --output DIR`: the command line of PAVE (SPEC §9).

The parser is generated from the fields of :class:`~fae.pave.runner.PaveConfig`; what PAVE samples, computes
and writes is :mod:`fae.pave.runner`.
"""

from __future__ import annotations

import argparse

from real_fae_core.command import add_config_arguments
from real_fae_core.config import add_option_flags
from fae.pave.runner import (HF_FIELDS, OPENAI_FIELDS, VLLM_FIELDS,  # noqa: F401 - the backends' flags, by name
                             PaveConfig, PaveFields, PaveHFFields)
from fae.pave.runner import run  # noqa: F401 - the command's run(config), for the dispatcher
from fae.backends.options import HFLoadFields, OpenAIServingFields, VLLMServingFields

CONFIG = PaveConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p, PaveFields)
    # The backends' own options, declared from their dataclasses (as `fae run` has them); PAVE's --seed
    # seeds each prompt's samples itself, and it reads no label probabilities from the FAE backends.
    g = p.add_argument_group("hf backend")
    add_config_arguments(g, PaveHFFields)
    add_option_flags(g, HFLoadFields)
    add_option_flags(p.add_argument_group("vllm backend (and --dtype)"), VLLMServingFields)
    add_option_flags(p.add_argument_group("openai backend"), OpenAIServingFields)
