"""`fae study --pools DIR --model M --output DIR`: the command line of the evaluation-choice study (SPEC §10).

The parser is generated from the fields of :class:`~fae.study.study_runner.StudyConfig`; what the study asks and
writes is :mod:`fae.study.study_runner`.
"""

from __future__ import annotations

import argparse

from real_fae_core.command import add_config_arguments
from real_fae_core.config import add_option_flags
from fae.backends.options import HFLoadFields, OpenAIServingFields, VLLMServingFields
from fae.study.study_runner import StudyConfig, StudyFields, StudyHFFields
from fae.study.study_runner import run  # noqa: F401 - the command's run(config), for the dispatcher

CONFIG = StudyConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `fae study`: the study's fields, then the hf, vllm and openai backends' options in
    groups of their own."""
    add_config_arguments(p, StudyFields)
    g = p.add_argument_group("hf backend")
    add_config_arguments(g, StudyHFFields)
    add_option_flags(g, HFLoadFields)
    add_option_flags(p.add_argument_group("vllm backend"), VLLMServingFields)
    add_option_flags(p.add_argument_group("openai backend"), OpenAIServingFields)
