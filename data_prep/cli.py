"""`real-data`: data preparation commands (convert, validate, pairs, enhance, counterfactual, its audit).

Each subcommand is one library module holding its config dataclass (a
:class:`~real_fae_core.command.CommandConfig`) and ``run(config) -> CommandResult``
(:mod:`real_fae_core.command`), registered here as ``"package.module:XConfig"``; the
dispatcher (:func:`real_fae_core.cli.dispatch`) generates its parser from the config, so a
Python caller gets the same checks as the command line, and commands are added without
touching each other.
"""

from __future__ import annotations

from real_fae_core.cli import dispatch

SUBCOMMANDS = {
    "convert": ("data_prep.converters.convert:ConvertConfig", "convert an official dataset release into claim records"),
    "validate": ("data_prep.validate.runner:ValidateConfig", "check a records file and report every bad line"),
    "pairs": ("data_prep.pairs.runner:PairsConfig", "build REAL training pairs (SPEC §4) as a HF dataset"),
    "enhance": ("data_prep.enhance.runner:EnhanceConfig", "enlarge gold evidence by a majority vote of annotator LLMs"),
    "counterfactual": ("data_prep.counterfactual.runner:CounterfactualConfig",
                       "counter-entity / counter-semantic evidence for fae pave"),
    "counterfactual-audit": ("data_prep.counterfactual.audit:AuditConfig",
                             "human audit of counterfactual evidence: a stratified sample as sheets for annotators"),
    "counterfactual-audit-score": ("data_prep.counterfactual.audit_score:AuditScoreConfig",
                                   "read the filled audit sheets back: pass rates, Fleiss' kappa, valid instances"),
    "families": ("data_prep.retrieval.families_runner:FamiliesConfig",
                 "claim families (related claims) for fae compare --families"),
    "index": ("data_prep.retrieval.index_runner:IndexConfig",
              "a BM25 index (SQLite FTS5) of a SciFact, Check-COVID or FEVER corpus"),
    "retrieve": ("data_prep.retrieval.retrieve_runner:RetrieveConfig",
                 "evidence pools from an index (SPEC §10): BM25 and reranker orderings, token-budget packing"),
}


def main(argv: list[str] | None = None) -> int:
    """`real-data COMMAND ...`: run one data-preparation subcommand; its exit code (2 for a usage error)."""
    return dispatch("real-data", __doc__, SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
