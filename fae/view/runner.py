"""`fae view RUN [RUN ...] --output DIR`: a :class:`ViewConfig` -> the static per-claim ablation explorer of its
runs (:func:`run`; docs/view.md).

Opens from the file system in any browser: no server, no network. A run
table (the report's metrics, each number a link to the claims behind it),
a claim list with filters (kept the gold label at round r, flipped,
invalid, cut off, hallucinated ids, NEI-gold excluded, dataset, gold label,
text) sorted by P(gold) drop, and a claim page with the pool of every round
(removed lines struck through, cited lines highlighted), the raw and parsed
answers and P(gold)/P(NEI) per round, several runs side by side by claim id.
"""

from __future__ import annotations

import dataclasses

from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import check_inputs
from fae.view.data import DEFAULT_SHARD_SIZE, build_view, load_view_runs
from fae.view.site import write_site


@dataclasses.dataclass
class ViewConfig(CommandConfig):
    """`fae view`: a static per-claim explorer of one or more runs."""

    runs: list[str] = option(positional=True, metavar="RUN_DIR",
                             help="fae run output directories (claims aligned by id)")
    output: str = option(metavar="DIR", help="where index.html and its data go")
    names: list[str] | None = option(None, help="run names (default: the run directory names)")
    records: str | None = option(None, metavar="FILE", help="the records file the runs read (default: the one in "
                                                            "each run's config.json; its sha256 must match)")
    title: str = option("FAE claims", help="page title")
    shard_size: int | None = option(None, min=1, metavar="N",
                                    help="claims per detail file loaded when a claim opens (default 100)")


def run(config: ViewConfig) -> CommandResult:
    """Write the explorer of ``config.runs`` into ``config.output``; ``outputs["page"]`` is its index.html."""
    if config.names and len(config.names) != len(config.runs):
        raise UserError(f"--names has {len(config.names)} names for {len(config.runs)} runs")
    shard_size = DEFAULT_SHARD_SIZE if config.shard_size is None else config.shard_size
    if shard_size < 1:
        raise UserError(f"--shard-size {config.shard_size}: must be at least 1")
    check_inputs(config.output, [*config.runs, config.records])  # the viewer's own marker guards the rest
    runs = load_view_runs(config.runs, config.names, config.records)
    index, shards = build_view(runs, shard_size=shard_size, title=config.title)
    page = write_site(index, shards, config.output)
    print(f"fae view: wrote {page} ({index['n_claims']} claims, {len(runs)} runs); open it in a browser")
    return CommandResult(outputs={"page": str(page), "site": str(config.output)},
                         summary={"n_claims": index["n_claims"], "n_runs": len(runs)})
