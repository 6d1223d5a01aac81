"""`fae study-report` (placeholder while written)."""
import argparse, dataclasses
from real_fae_core.command import CommandConfig, CommandResult


@dataclasses.dataclass
class ReportConfig(CommandConfig):
    studies: list[str]
    output: str


CONFIG = ReportConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("studies", nargs="+")
    p.add_argument("--output", required=True)


def run(config):
    return CommandResult()
