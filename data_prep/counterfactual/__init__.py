"""Counterfactual evidence for PAVE (SPEC §9): misleading versions of the gold evidence.

Two kinds, as in the PAVE paper: ``entity`` (counter-entity: a salient span
of a gold sentence replaced by another of the same kind, a fine-grained
factual error) and ``semantic`` (counter-semantic: the sentence rewritten by
an LLM to contradict it, a broader error). Records get
``counterfactual_sentences: {"entity": [...], "semantic": [...]}`` with the
gold sentences' ids. Modules: ``entity`` (rule-based swaps, no model),
``rewrite`` (LLM prompts and the topic check), ``runner`` (LLM requests
through the enhancement client and cache), ``cli`` (``real-data counterfactual``).
"""

from .entity import SpanCorpus, entity_swap, find_spans
from .rewrite import content_words, rewrite_problem, topic_overlap

KINDS = ("entity", "semantic")

__all__ = ["KINDS", "SpanCorpus", "content_words", "entity_swap", "find_spans", "rewrite_problem", "topic_overlap"]
