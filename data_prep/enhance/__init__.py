"""Evidence enhancement (SPEC §5): several annotator LLMs pick evidence, a majority vote keeps it.

Gold evidence in FEVER-style datasets is sufficient, not exhaustive; REAL's
ablated negatives need every supporting sentence removed, so annotator LLMs
reached through OpenAI-compatible endpoints add the sentences a strict
majority of them pick. Modules: ``config`` (annotator YAML), ``prompt``
(annotator prompt + answer parser), ``client`` (async requests with retries),
``cache`` (SQLite answer cache for resume), ``vote`` (pure vote and metrics),
``runner`` (orchestration), ``cli`` (the ``real-data enhance`` subcommand).
Around each request (locks, cache, de-duplication, counts, interrupts) is
:mod:`data_prep.llm_requests`, shared with ``real-data counterfactual``.
"""

from .config import AnnotatorConfig, ConfigError, load_annotators
from .vote import enhanced_evidence, majority_picks, votes_needed

__all__ = [
    "AnnotatorConfig",
    "ConfigError",
    "load_annotators",
    "enhanced_evidence",
    "majority_picks",
    "votes_needed",
]
