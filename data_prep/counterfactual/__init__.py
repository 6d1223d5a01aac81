"""Counterfactual evidence for PAVE (SPEC §9): misleading versions of the gold evidence.

Two kinds, as in the PAVE paper: ``entity`` (counter-entity: a span of a
gold sentence replaced by another of the same kind, a fine-grained factual
error) and ``semantic`` (counter-semantic: the sentence rewritten by an LLM
to contradict it, a broader error). Both are claim-aware: the new sentence
must carry the verdict opposite to the claim's gold label, checked by rule
or by an LLM judge. Records get ``counterfactual_sentences: {"entity":
[...], "semantic": [...]}`` with the gold sentences' ids. Modules:
``entity`` (rule-based swaps, no model), ``rewrite`` (LLM prompts, the topic
check, the judge's prompt), ``runner`` (``real-data counterfactual``: its options and its run, LLM
requests through the shared LLM layer, :mod:`data_prep.llm`), ``audit`` (``real-data counterfactual-audit``:
the human validity audit's sheets out) and ``audit_score`` (``real-data counterfactual-audit-score``: their
agreement back).
"""

from .entity import ClaimSwap, SpanCorpus, claim_aware_swap, find_spans
from .rewrite import OPPOSITE, content_words, rewrite_problem, topic_overlap

KINDS = ("entity", "semantic")

__all__ = ["KINDS", "OPPOSITE", "ClaimSwap", "SpanCorpus", "claim_aware_swap", "content_words", "find_spans",
           "rewrite_problem", "topic_overlap"]
