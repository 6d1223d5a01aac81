"""Evidence enhancement (SPEC §5): several annotator LLMs pick evidence, a majority vote keeps it.

Gold evidence in FEVER-style datasets is sufficient, not exhaustive; REAL's
ablated negatives need every supporting sentence removed, so annotator LLMs
reached through OpenAI-compatible endpoints add the sentences a strict
majority of them pick. Modules: ``prompt`` (annotator prompt + answer parser),
``vote`` (pure vote and metrics), ``runner`` (the ``real-data enhance`` command: its
options and its run, the orchestration). The annotator YAML,
the async client with its retries, the SQLite answer cache and everything around
each request (locks, de-duplication, counts, interrupts) are the shared LLM layer,
:mod:`data_prep.llm`, which ``real-data counterfactual`` uses too.
"""

from data_prep.llm.config import AnnotatorConfig, ConfigError, load_annotators
from .vote import enhanced_evidence, majority_picks, votes_needed

__all__ = [
    "AnnotatorConfig",
    "ConfigError",
    "load_annotators",
    "enhanced_evidence",
    "majority_picks",
    "votes_needed",
]
