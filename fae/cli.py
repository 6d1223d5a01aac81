"""`fae`: Fact-Ablated Evaluation, reports, probes and verifier comparisons.

Each subcommand is one library module holding its config dataclass and ``run(config) -> CommandResult``
(:mod:`real_fae_core.command`), registered here as ``"package.module:XConfig"``: the dispatcher
(:func:`real_fae_core.cli.dispatch`) generates its parser from the config, and what a command needs beyond its
fields (`fae run`'s ``--config YAML`` and checks after parsing) is declared on its config. A rank under
``accelerate launch`` is also tied to its launcher and sibling ranks here.
"""

from __future__ import annotations

from real_fae_core.cli import dispatch
from real_fae_core.lifeline import answer_sigterm, die_with_launcher, launched, leave, watch_peers

SUBCOMMANDS = {
    "run": ("fae.ablation.runner:FaeRunConfig", "run multi-round evidence ablation (SPEC §6) on a verifier"),
    "merge": ("fae.ablation.merge:MergeConfig",
              "join the shards of a run (fae run --shard I/N) into one run directory"),
    "checkpoints": ("fae.ablation.checkpoints:CheckpointsConfig",
                    "FAE of every checkpoint-N of a training output; Acc/IS per step"),
    "report": ("fae.ablation.report:ReportConfig", "Table-1 report and trajectory plot for one or more runs"),
    "probe": ("fae.probes.runner:ProbeConfig", "DirK hidden-state probe over an FAE run (SPEC §7)"),
    "probe-report": ("fae.probes.report:ProbeReportConfig", "DirK figure and table for one or more probe outputs"),
    "neurons": ("fae.probes.neurons:NeuronsConfig", "MLP neuron overlap of evidence- vs knowledge-based prompts"),
    "compare": ("fae.comparison.compare:CompareConfig", "answer/evidence score accounting between two runs (SPEC §8)"),
    "pave": ("fae.pave.runner:PaveConfig", "PAVE prior-state diagnostics (SPEC §9)"),
    "study": ("fae.study.runner:StudyConfig", "ask one model every condition of the evaluation-choice grid (SPEC §10)"),
    "study-report": ("fae.study.report:StudyReportConfig",
                     "scores, contrasts, intervals and controls of study runs (SPEC §10)"),
    "view": ("fae.view.runner:ViewConfig", "static per-claim ablation explorer (HTML) for one or more runs"),
    "from-inspect": ("fae.harness.from_inspect:FromInspectConfig",
                     "an Inspect AI log of real_fae/fae as a run directory"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch; a rank of ``accelerate launch -m fae.cli run ...`` (``argv`` None) is tied to its launcher
    and its sibling ranks, and leaves through :func:`real_fae_core.lifeline.leave`."""
    die_with_launcher()
    watch_peers("fae")
    answer_sigterm("fae")  # SIGTERM ends a rank with a line that says why
    code = dispatch("fae", __doc__, SUBCOMMANDS, argv)
    if argv is None and launched():
        leave("fae", code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
