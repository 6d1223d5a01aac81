"""`real-data counterfactual-audit-score AUDIT_DIR`: the filled audit sheets -> pass rates and Fleiss' κ.

The logic lives in :mod:`data_prep.counterfactual.audit`; this module is the
subcommand's entry point.
"""

from .audit import AuditScoreConfig as CONFIG
from .audit import add_score_arguments as add_arguments
from .audit import run_score as run

__all__ = ["CONFIG", "add_arguments", "run"]
