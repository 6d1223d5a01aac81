"""The training data: the pairs dataset of ``real-data pairs``, its variant check and its fingerprint."""

from __future__ import annotations

from pathlib import Path

from real_fae_core.errors import UserError
from real_fae_core.hashing import sha256_tree


def load_pairs(path: str | None, split: str = "train"):
    """The pairs dataset of ``real-data pairs``: a save_to_disk dir or a JSONL file."""
    from datasets import DatasetDict, load_dataset, load_from_disk

    if not path:
        raise UserError("no training data: set dataset_name to the output of `real-data pairs`")
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"dataset {path!r} does not exist; build it with `real-data pairs`")
    if p.is_dir() and ((p / "dataset_dict.json").exists() or (p / "state.json").exists()):
        ds = load_from_disk(str(p))
    elif p.is_dir() and (p / "pairs.jsonl").exists():
        ds = load_dataset("json", data_files=str(p / "pairs.jsonl"))
    elif p.is_file() and p.suffix in (".jsonl", ".json"):
        ds = load_dataset("json", data_files=str(p))
    else:
        raise UserError(f"dataset {path!r} is neither a `real-data pairs` directory nor a .jsonl file")
    if isinstance(ds, DatasetDict):
        if split not in ds:
            raise UserError(f"dataset {path!r} has no split {split!r} (it has {', '.join(ds)})")
        ds = ds[split]
    missing = {"prompt", "completion"} - set(ds.column_names)
    if missing:
        raise UserError(f"dataset {path!r} has no {'/'.join(sorted(missing))} column: it is not a pairs dataset")
    if len(ds) == 0:
        raise UserError(f"dataset {path!r} is empty")
    return ds


def check_variant(ds, variant: str | None, path: str) -> dict:
    """Counts per kind/variant; refuse a dataset built for another variant."""
    info = {"pairs": len(ds)}
    if "variant" in ds.column_names:
        found = sorted(set(ds["variant"]))
        info["variants"] = found
        if variant is not None and found != [variant]:
            raise UserError(
                f"dataset {path!r} was built for variant {', '.join(found)} but the recipe says variant {variant!r}"
            )
    if "kind" in ds.column_names:
        kinds: dict[str, int] = {}
        for k in ds["kind"]:
            kinds[k] = kinds.get(k, 0) + 1
        info["by_kind"] = kinds
    return info


def is_data_file(f: Path, root: Path) -> bool:
    """A file of the dataset itself: ``datasets`` writes map/filter caches (cache-*.arrow) beside the data."""
    rel = f.relative_to(root)
    return f.is_file() and not f.name.startswith("cache-") and not any(part.startswith(".") for part in rel.parts)


def data_fingerprint(path: str) -> str:
    """sha256 over the dataset's files (sorted by relative path), for the model card and the run fingerprint."""
    p = Path(path).expanduser()
    if p.is_file():
        return sha256_tree(p.parent, [p])
    return sha256_tree(p, sorted(f for f in p.rglob("*") if is_data_file(f, p)))
