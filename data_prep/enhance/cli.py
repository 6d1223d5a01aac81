"""`real-data enhance`: annotate evidence with several LLMs and keep the majority picks.

    real-data enhance --records in.jsonl --annotators recipes/annotators/paper.yaml --output out.jsonl
    real-data enhance ... --dry-run                 # request count + token estimate, nothing sent
    real-data enhance --records out.jsonl --revote --min-votes 1 --output out2.jsonl   # no requests

Re-running the same command resumes: answers come from the cache, only what
is missing is requested. Exit codes (docs/errors.md): 0 complete, 1 some
requests failed (everything else written; run again to retry them), 2 bad
input or the output/cache is in use by another enhance, 130 interrupted,
143 terminated; on 130/143 one line says what was kept and the command to resume.
"""

from __future__ import annotations

from real_fae_core.command import CommandResult
from .options import EnhanceConfig

CONFIG = EnhanceConfig


def add_arguments(p) -> None:
    p.add_argument("--records", required=True, help="input claim records (JSONL)")
    p.add_argument("--annotators",
                   help="annotators YAML (recipes/annotators/*.yaml); not needed with --revote")
    p.add_argument("--output", required=True,
                   help="output JSONL; the summary goes to OUTPUT.summary.json")
    p.add_argument("--cache",
                   help="SQLite answer cache (default: OUTPUT.cache.sqlite); reuse it to resume")
    p.add_argument("--dry-run", action="store_true",
                   help="print the number of requests and an input-token estimate; send nothing")
    p.add_argument("--min-votes", type=int, metavar="K",
                   help="votes a sentence needs (default: strict majority of the configured annotators)")
    p.add_argument("--revote", action="store_true",
                   help="recompute enhanced_evidence from the 'annotations' of an enhanced file; no requests")
    p.add_argument("--include-nei", action="store_true",
                   help="also annotate NOT_ENOUGH_INFO claims (default: passed through unchanged)")
    p.add_argument("--retry-abstentions", action="store_true",
                   help="re-ask annotators whose cached answer was an abstention (malformed answer)")
    p.add_argument("--max-in-flight", type=int, metavar="N",
                   help="at most N requests in flight over all annotators (each also has max_concurrency)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(config: EnhanceConfig) -> CommandResult:
    # imported here: the runner imports the openai client (~1 s), which `real-data --help` and the other
    # subcommands do not need
    from .runner import run as run_enhance

    return run_enhance(config)
