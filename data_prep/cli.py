"""`real-data`: data preparation commands (convert, validate, pairs, enhance, counterfactual, its audit).

Each subcommand lives in its own module exposing ``add_arguments(parser)``,
its typed options ``CONFIG`` (a :class:`~real_fae_core.command.CommandConfig`)
and ``run(config) -> CommandResult`` (:mod:`real_fae_core.command`), so a
Python caller gets the same checks as the command line; this file only
dispatches, so commands can be added without touching each other.
"""

from __future__ import annotations

from real_fae_core.cli import dispatch

SUBCOMMANDS = {
    "convert": ("data_prep.converters.cli", "convert an official dataset release into claim records"),
    "validate": ("data_prep.validate.cli", "check a records file and report every bad line"),
    "pairs": ("data_prep.pairs.cli", "build REAL training pairs (SPEC §4) as a HF dataset"),
    "enhance": ("data_prep.enhance.cli", "enlarge gold evidence by a majority vote of annotator LLMs"),
    "counterfactual": ("data_prep.counterfactual.cli", "counter-entity / counter-semantic evidence for fae pave"),
    "counterfactual-audit": ("data_prep.counterfactual.audit",
                             "human audit of counterfactual evidence: a stratified sample as sheets for annotators"),
    "counterfactual-audit-score": ("data_prep.counterfactual.audit_score",
                                   "read the filled audit sheets back: pass rates, Fleiss' kappa, valid instances"),
    "families": ("data_prep.retrieval.families_cli", "claim families (related claims) for fae compare --families"),
    "index": ("data_prep.retrieval.index_cli", "a BM25 index (SQLite FTS5) of a SciFact, Check-COVID or FEVER corpus"),
    "retrieve": ("data_prep.retrieval.retrieve_cli",
                 "evidence pools from an index (SPEC §10): BM25 and reranker orderings, token-budget packing"),
}


def main(argv: list[str] | None = None) -> int:
    """`real-data COMMAND ...`: run one data-preparation subcommand; its exit code (2 for a usage error)."""
    return dispatch("real-data", __doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
