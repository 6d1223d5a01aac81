"""FAE inside evaluation harnesses: the Inspect AI task (``inspect eval real_fae/fae``) and the way back
from an Inspect log to a run directory (``fae from-inspect``). docs/inspect.md."""
