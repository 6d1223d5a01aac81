"""`fae study --pools DIR --model M --output DIR`: the command line of the evaluation-choice study (SPEC §10).

The parser is generated from the fields of :class:`~fae.study.study_runner.StudyConfig`; what the study asks and
writes is :mod:`fae.study.study_runner`.
"""

from __future__ import annotations

import argparse

from real_fae_core.command import add_config_arguments, field_names
from fae.backends.options import HFLoadFields, OpenAIServingFields, VLLMServingFields
from fae.study.study_runner import StudyConfig, StudyFields, StudyHFFields
from fae.study.study_runner import run  # noqa: F401 - the command's run(config), for the dispatcher

CONFIG = StudyConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `fae study`: the study's fields, then the hf, vllm and openai backends' options, each
    under its heading (their fields' `group`)."""
    add_config_arguments(p, StudyConfig, field_names(StudyFields, StudyHFFields, HFLoadFields, VLLMServingFields,
                                                     OpenAIServingFields))
