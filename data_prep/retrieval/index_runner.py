"""`real-data index --corpus FILE --format F --output INDEX`: the on-disk BM25 index of SPEC §10.

One SQLite FTS5 file over each document's title and body (docs/retrieval.md). Formats: ``scifact``
(``corpus.jsonl`` or the shipped ``corpus_cited.jsonl``), ``check-covid`` (``corpus.json``),
``fever`` (the ``wiki-pages/`` directory or one shard). A corpus line without its id or text, a
duplicate id or an empty corpus is one line naming the file, line and field (exit 2), and no index
is left behind.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_file
from data_prep.retrieval.corpus import FORMATS
from data_prep.retrieval.index import build_index, is_index


@dataclasses.dataclass
class IndexConfig(CommandConfig):
    """`real-data index`: a BM25 index of one corpus."""

    corpus: str = option(help="corpus JSONL (SciFact corpus.jsonl, Check-COVID corpus.json) or FEVER's wiki-pages/ "
                              "directory")
    format: str = option(metavar="{" + ",".join(FORMATS) + "}",  # a name in FORMATS
                         help="how to read the corpus: scifact (doc_id, title?, abstract), check-covid (cord_id, "
                              "title, abstract), fever (id, text, lines)")
    output: str = option(help="the index file to write (SQLite)")
    overwrite: bool = option(False, help="replace an existing index file")


def run(config: IndexConfig) -> CommandResult:
    """`real-data index` as a function: the BM25 index file at ``config.output`` (its counts as ``summary``);
    an unknown format, a missing corpus or a directory as output is a :class:`UserError`."""
    if config.format not in FORMATS:
        raise UserError(f"--format {config.format!r}: unknown; choose from {', '.join(FORMATS)}")
    corpus, out = Path(config.corpus), Path(config.output)
    if not corpus.exists():
        raise UserError(f"--corpus {config.corpus}: no such file or directory")
    if out.is_dir():
        raise UserError(f"--output {config.output}: is a directory; give the index file's name")
    claim_file(out, "real-data index", inputs=[corpus], overwrite=config.overwrite, owned=is_index)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = build_index(corpus, config.format, out)
    print(f"{out}: {counts['documents']} documents, {counts['units']} units indexed in {counts['seconds']} s")
    return CommandResult(outputs={"index": str(out)}, summary=counts)
