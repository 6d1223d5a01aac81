"""Write the static site: index.html, the shipped JS/CSS, the index and the detail shards.

Data files are JavaScript (``FAE_VIEW.index({...})``, ``FAE_VIEW.shard(k, [...])``)
rather than JSON because browsers refuse ``fetch()`` of local files: a
``<script>`` tag works from ``file://``. The site is built in a temporary
directory and swapped in whole (:func:`real_fae_core.atomicio.atomic_dir`),
so a stopped ``fae view`` never leaves half a viewer; a directory that is not
a viewer is refused rather than replaced.
"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path
from typing import Iterable

from real_fae_core.atomicio import atomic_dir
from real_fae_core.errors import UserError

ASSETS = Path(__file__).resolve().parent / "assets"
ASSET_FILES = ("view.js", "view.css")
MARKER = ".fae-view"  # written into every viewer directory: safe to replace


def shard_name(k: int) -> str:
    """The viewer-relative path of claim shard ``k`` (zero-padded, so the files sort in claim order)."""
    return f"data/claims/{k:05d}.js"


def as_script(call: str, *args) -> str:
    """``call(arg, ...);`` with JSON arguments: a data file loadable by a ``<script>`` tag."""
    return f"{call}({','.join(json.dumps(a, ensure_ascii=False, separators=(',', ':')) for a in args)});\n"


def index_html(title: str) -> str:
    """The viewer's index.html, titled ``title`` (escaped); the page itself is drawn by assets/view.js."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<link rel="stylesheet" href="assets/view.css">
</head>
<body data-state="loading">
<header><a href="#" class="home">{html.escape(title)}</a><span id="where"></span></header>
<main id="app"><p class="note">Loading the index&hellip; (this page needs JavaScript)</p></main>
<script src="assets/view.js"></script>
<script src="data/index.js" onerror="document.getElementById('app').textContent = 'Cannot load data/index.js: is the viewer complete?'"></script>
</body>
</html>
"""


def check_output(out: Path) -> None:
    """Refuse to replace a non-empty directory that is not a viewer (``--output .`` must not wipe a project)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        shown = ", ".join(sorted(p.name for p in out.iterdir())[:3])
        raise UserError(f"--output {out}: not empty and not a `fae view` output (holds {shown}); "
                        "pass a new or empty directory")


def write_site(index: dict, shards: Iterable[list[dict]], output: str | Path) -> Path:
    """Write the viewer into ``output`` (replacing an earlier viewer there); the path of its index.html."""
    out = Path(output)
    check_output(out)
    with atomic_dir(out, replace=True) as tmp:
        (tmp / MARKER).write_text("written by `fae view`; the directory is replaced by each run of it\n")
        (tmp / "assets").mkdir()
        for name in ASSET_FILES:
            shutil.copyfile(ASSETS / name, tmp / "assets" / name)
        (tmp / "data" / "claims").mkdir(parents=True)
        for k, shard in enumerate(shards):
            (tmp / shard_name(k)).write_text(as_script("FAE_VIEW.shard", k, shard), encoding="utf-8")
        (tmp / "data" / "index.js").write_text(as_script("FAE_VIEW.index", index), encoding="utf-8")
        (tmp / "index.html").write_text(index_html(index["title"]), encoding="utf-8")
    return out / "index.html"
