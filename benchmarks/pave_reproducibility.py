"""Are `fae pave`'s samples the same from one process to the next on this machine, and after a kill and resume?

PAVE's resume guarantee (docs/runs.md, "Sampled diagnostics") holds only where sampling is reproducible: a
killed run resumes into the same ``samples.jsonl``, so a resumed run equals an uninterrupted one only if every
process draws the same samples. With the default N-row prefill that held on every CPU measured; with
``--prefill-once`` it depends on the CPU's kernels (docs/compare.md). This check runs the same ``fae pave``
command ``--runs`` times in fresh processes, then once more killed (SIGKILL) after its first claims and
resumed, and compares the ``samples.jsonl`` files: byte for byte, and sample by sample where they differ.
Exit status 1 when any differs.

    python benchmarks/pave_reproducibility.py --records cf.jsonl --model models/smollm2-135m-instruct \\
        --limit 4 --json pave_reproducibility.json -- --prefill-once --constrained-decoding

Everything after ``--`` is passed to ``fae pave`` as it is (``--output``, ``--limit`` and ``--chunk-size``
are this check's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path



OWN_OPTIONS = ("--output", "--limit", "--chunk-size")  # set per run by this check, refused after --


def pave_command(args, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "fae.cli", "pave", "--records", str(args.records), "--model", args.model,
           "--output", str(out), "--limit", str(args.limit), "--chunk-size", "1", "--no-progress"]
    if args.adapter:
        cmd += ["--adapter", args.adapter]
    return cmd + list(args.pave_args)


def run_to_end(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"pave_reproducibility: fae pave failed ({res.returncode}): {res.stderr[-2000:].strip()}")


def killed_then_resumed(cmd: list[str], samples: Path, claims_before_kill: int) -> tuple[bool, int]:
    """Run ``cmd``, SIGKILL it once ``claims_before_kill`` claims are written, run it again to the end;
    return whether it was killed before it finished and how many claims it had written."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        if samples.exists() and samples.read_bytes().count(b"\n") >= claims_before_kill:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    _, err = proc.communicate()
    if proc.returncode not in (0, -signal.SIGKILL):
        raise SystemExit(f"pave_reproducibility: fae pave failed ({proc.returncode}): {err.decode()[-2000:].strip()}")
    kept = samples.read_bytes().count(b"\n") if samples.exists() else 0
    run_to_end(cmd)
    return proc.returncode == -signal.SIGKILL, kept


def samples_by_key(path: Path) -> dict[tuple, str]:
    """(claim id, condition, sample index) -> the sampled text."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        for condition, answers in row["conditions"].items():
            for i, text in enumerate(answers["raw"]):
                out[(row["id"], condition, i)] = text
    return out


def compare(reference: Path, other: Path) -> dict:
    ref, got = samples_by_key(reference), samples_by_key(other)
    differing = sorted(k for k in ref.keys() | got.keys() if ref.get(k) != got.get(k))
    return {"sha256": hashlib.sha256(other.read_bytes()).hexdigest(),
            "byte_identical": reference.read_bytes() == other.read_bytes(),
            "samples": len(ref), "differing_samples": len(differing),
            "first_differing": [list(k) for k in differing[:5]]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--records", required=True, type=Path, help="fae pave's records (counterfactual pools)")
    p.add_argument("--model", required=True)
    p.add_argument("--adapter")
    p.add_argument("--limit", type=int, default=4, help="claims per run")
    p.add_argument("--runs", type=int, default=3, help="uninterrupted runs, each in a fresh process")
    p.add_argument("--kill-after", type=int, default=1, help="claims the killed run writes before SIGKILL")
    p.add_argument("--json", type=Path)
    p.add_argument("pave_args", nargs="*", help="after --: more fae pave options (e.g. --prefill-once)")
    args = p.parse_args(argv)
    if args.runs < 2 or not 0 < args.kill_after < args.limit:
        p.error("needs --runs >= 2 and 0 < --kill-after < --limit")
    owned = sorted({a.split("=")[0] for a in args.pave_args} & set(OWN_OPTIONS))
    if owned:  # every run would write, or resume, the same output: equal files that prove nothing
        p.error(f"{', '.join(owned)} after -- : this check sets {', '.join(OWN_OPTIONS)} itself")
    import torch

    from real_fae_core.hardware import native_bf16_cpu_flags

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        outs = [work / f"run-{k}" for k in range(args.runs)]
        for out in outs:
            run_to_end(pave_command(args, out))
        resumed = work / "killed-and-resumed"
        killed, kept = killed_then_resumed(pave_command(args, resumed), resumed / "samples.jsonl", args.kill_after)
        reference = outs[0] / "samples.jsonl"
        result = {
            "command": ["fae", *pave_command(args, Path("OUT"))[3:]],
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                        "native_bf16": native_bf16_cpu_flags(),
                        "torch": torch.__version__, "threads": torch.get_num_threads()},
            "runs": [compare(reference, out / "samples.jsonl") for out in outs],
            "killed_and_resumed": {"killed": killed, "claims_before_kill": kept, **compare(reference, resumed / "samples.jsonl")},
        }
    checked = result["runs"][1:] + [result["killed_and_resumed"]]
    result["reproducible"] = all(c["byte_identical"] for c in checked) and killed
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if not killed:
        print("pave_reproducibility: the run to kill finished first; use more --limit", file=sys.stderr)
        return 1
    if not result["reproducible"]:
        print(f"pave_reproducibility: samples differ between processes ({sum(not c['byte_identical'] for c in checked)}"
              f" of {len(checked)} runs against the first): a resumed run may not equal an uninterrupted one",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
