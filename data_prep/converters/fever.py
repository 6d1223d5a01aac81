"""FEVER (Thorne et al., NAACL 2018) over the official wiki-pages dump.

Source: ``train.jsonl`` / ``shared_task_dev.jsonl`` + the ``wiki-pages/``
directory (``wiki-NNN.jsonl`` shards). Pool = every sentence of every page
cited by any gold group, pages in order of first citation, lines in page
order; sentence ids run 0..n-1 over the pool and ``doc`` is the page id as
FEVER spells it. Gold groups map (page, line) to pool ids, deduplicated.

Memory stays flat in the dump size: pass 1 reads the claims and keeps only
the set of cited page titles, pass 2 streams the shards and parses a page in
full only when its title is needed (the title is read from the start of the
line without decoding the rest), pass 3 reads the claims again and emits.
"""

from __future__ import annotations

import json
import re
import unicodedata
from json.decoder import scanstring
from pathlib import Path
from typing import Iterator

from real_fae_core.errors import UserError
from real_fae_core.jsonl import surrogate_error
from real_fae_core.progress import progress_bar
from data_prep.records import NOT_ENOUGH_INFO, REFUTE, SUPPORT, ClaimRecord, Sentence

from .base import (
    NEI_REASON,
    Converter,
    ConvertInputs,
    ConvertStats,
    Emitted,
    InputError,
    get_field,
    get_label,
    read_jsonl,
)

NAME = "fever"
LABELS = {"SUPPORTS": SUPPORT, "REFUTES": REFUTE, "NOT ENOUGH INFO": NOT_ENOUGH_INFO}

# PTB-style escapes used in the FEVER wiki dump's sentence text.
_ESCAPES = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}",
            "-COLON-": ":", "``": '"', "''": '"'}
_ESCAPE_RE = re.compile("|".join(re.escape(k) for k in _ESCAPES))
_ID_PREFIX = '{"id": "'


def unescape(text: str) -> str:
    """``-LRB- 2012 -RRB-`` -> ``( 2012 )``; spacing is left as tokenized."""
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], text)


def norm_title(title: str) -> str:
    """A page title in NFC, so a claim file's title finds its page in the dump."""
    # The dump and the claim files do not always agree on Unicode normal form.
    return unicodedata.normalize("NFC", title)


def parse_claim(obj: dict, path, lineno: int):
    """Return (id, claim, label, groups) with groups as lists of (page, line)."""
    cid = get_field(obj, "id", (int, str), path, lineno)
    claim = get_field(obj, "claim", str, path, lineno, nonempty=True)
    label = get_label(obj, "label", LABELS, path, lineno)
    raw_ev = get_field(obj, "evidence", list, path, lineno)
    groups: list[list[tuple[str, int]]] = []
    if label == NOT_ENOUGH_INFO:
        return cid, claim, label, groups
    for g, group in enumerate(raw_ev):
        if not isinstance(group, list) or not group:
            raise InputError(path, lineno, f"evidence[{g}]", "must be a non-empty list of evidence items")
        items = []
        for k, item in enumerate(group):
            fld = f"evidence[{g}][{k}]"
            if not isinstance(item, list) or len(item) != 4:
                raise InputError(path, lineno, fld, "must be [annotation_id, evidence_id, page, line]")
            page, line = item[2], item[3]
            if not isinstance(page, str) or not page:
                raise InputError(path, lineno, fld, f"page must be a wiki page id, got {page!r}")
            if isinstance(line, bool) or not isinstance(line, int) or line < 0:
                raise InputError(path, lineno, fld, f"line must be a line number, got {line!r}")
            items.append((page, line))
        groups.append(items)
    if not groups:
        raise InputError(path, lineno, "evidence", f"a {obj['label']} claim needs at least one evidence group")
    return cid, claim, label, groups


def needed_pages(claim_files: list[Path]) -> set[str]:
    """Pass 1: the (normalised) titles cited by any verifiable claim."""
    needed: set[str] = set()
    for path in claim_files:
        for lineno, obj in read_jsonl(path):
            _, _, _, groups = parse_claim(obj, path, lineno)
            for group in groups:
                for page, _ in group:
                    needed.add(norm_title(page))
    return needed


def wiki_shards(wiki: Path) -> list[Path]:
    """The wiki-pages files to read: ``wiki`` itself when a file, else its shards in name order; a directory
    without any is a :class:`UserError`."""
    if wiki.is_file():
        return [wiki]
    shards = sorted(wiki.glob("wiki-*.jsonl")) or sorted(wiki.glob("*.jsonl"))
    if not shards:
        raise UserError(f"{wiki}: no wiki-pages shards (wiki-NNN.jsonl) found")
    return shards


def parse_lines(text: str, path, lineno: int) -> list[str]:
    """The ``lines`` field -> sentence text per line number ('' where empty)."""
    out: list[str] = []
    for row in text.split("\n"):
        if not row:
            continue
        idx, _, rest = row.partition("\t")
        if not (idx.isascii() and idx.isdigit()):
            raise InputError(path, lineno, "lines", f"row {row[:40]!r} does not start with a line number")
        if len(idx) > 6:
            raise InputError(path, lineno, "lines", f"line number {idx[:40]} is out of range")
        n = int(idx)
        if n >= len(out):
            out.extend([""] * (n + 1 - len(out)))
        out[n] = unescape(rest.split("\t", 1)[0]).strip()
    return out


def load_pages(wiki: Path, needed: set[str], stats: ConvertStats | None = None) -> dict[str, list[str]]:
    """Pass 2: stream every shard, keep the lines of the needed pages only."""
    pages: dict[str, list[str]] = {}
    scanned = reported = 0
    with progress_bar(desc="wiki-pages", unit=" pages", mininterval=2.0) as bar:
        for shard in wiki_shards(wiki):
            with shard.open("rb") as fh:
                offset = 0
                for lineno, raw in enumerate(fh, start=1):
                    line = _decode(raw, shard, lineno, offset)
                    offset += len(raw)
                    scanned += 1
                    if scanned - reported >= 20000:
                        bar.update(scanned - reported)
                        reported = scanned
                    title = None
                    if line.startswith(_ID_PREFIX):
                        try:
                            title = scanstring(line, len(_ID_PREFIX))[0]
                        except ValueError:
                            title = None
                    obj = None
                    if title is None:  # unusual layout: decode the whole line
                        if not line.strip():
                            continue
                        obj = _loads(line, shard, lineno)
                        title = obj.get("id")
                        if not isinstance(title, str):
                            raise InputError(shard, lineno, "id", "missing or not a string")
                    key = norm_title(title)
                    if key not in needed or key in pages:
                        continue
                    if obj is None:
                        obj = _loads(line, shard, lineno)
                    lines = obj.get("lines")
                    if not isinstance(lines, str):
                        raise InputError(shard, lineno, "lines", "missing or not a string")
                    pages[key] = parse_lines(lines, shard, lineno)
            bar.update(scanned - reported)
            reported = scanned
    if stats is not None:
        stats.info["wiki_pages_scanned"] = scanned
        stats.info["wiki_pages_needed"] = len(needed)
        stats.info["wiki_pages_found"] = len(pages)
    return pages


def _decode(raw: bytes, path, lineno: int, offset: int) -> str:
    """One shard line as text; a non-UTF-8 byte is an InputError naming line and byte offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, lineno, None,
                         f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at byte offset {offset + exc.start} "
                         f"(column {exc.start + 1}); the wiki-pages shards must be UTF-8") from None


def _loads(line: str, path, lineno: int) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(path, lineno, None, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise InputError(path, lineno, None, "invalid JSON (nested too deeply)") from None
    except ValueError:  # Python's 4300-digit limit on integers
        raise InputError(path, lineno, None, "invalid JSON (a number has more than 4300 digits)") from None
    if not isinstance(obj, dict):
        raise InputError(path, lineno, None, "expected a JSON object")
    bad = surrogate_error(line, obj)
    if bad is not None:
        raise InputError(path, lineno, bad.field, bad.reason)
    return obj


def build_record(cid, claim, label, groups, pages, path, lineno, stats) -> ClaimRecord | None:
    """Pool of the cited pages + groups as pool ids, or None (dropped, counted)."""
    order: list[str] = []
    for group in groups:
        for page, line in group:
            key = norm_title(page)
            lines = pages.get(key)
            if lines is None:
                stats.drop("page not in wiki-pages", path, lineno, "evidence", repr(page))
                return None
            if line >= len(lines):
                stats.drop("evidence line not on the page", path, lineno, "evidence",
                           f"{page!r} line {line} (page has {len(lines)} lines)")
                return None
            if not lines[line]:
                stats.drop("gold line is empty", path, lineno, "evidence", f"{page!r} line {line}")
                return None
            if page not in order:
                order.append(page)
    sentences: list[Sentence] = []
    pool_id: dict[tuple[str, int], int] = {}
    for page in order:
        for n, text in enumerate(pages[norm_title(page)]):
            if text:
                pool_id[(page, n)] = len(sentences)
                sentences.append(Sentence(id=len(sentences), text=text, doc=page))
    evidence: list[list[int]] = []
    for group in groups:
        ids = sorted({pool_id[item] for item in group})
        if ids not in evidence:
            evidence.append(ids)
    return ClaimRecord(id=f"{NAME}-{cid}", dataset=NAME, claim=claim, label=label,
                       sentences=sentences, evidence=evidence)


def convert(inputs: ConvertInputs, stats: ConvertStats) -> Iterator[Emitted]:
    """One record per usable FEVER claim (record, file, line), reading only the wiki pages the claims cite;
    NEI claims (no evidence pages) and unusable ones are counted in ``stats`` as drops."""
    needed = needed_pages(inputs.claims)
    pages = load_pages(inputs.wiki_pages, needed, stats)
    for path in inputs.claims:
        for lineno, obj in read_jsonl(path):
            stats.claims_read += 1
            cid, claim, label, groups = parse_claim(obj, path, lineno)
            if label == NOT_ENOUGH_INFO:
                if not inputs.include_nei:
                    stats.drop(NEI_REASON, path, lineno, "label")
                else:
                    stats.drop("NOT_ENOUGH_INFO claim has no evidence pages (empty pool)",
                               path, lineno, "evidence")
                continue
            rec = build_record(cid, claim, label, groups, pages, path, lineno, stats)
            if rec is not None:
                yield rec, path, lineno


CONVERTER = Converter(NAME, "FEVER: --claims train.jsonl --wiki-pages wiki-pages/",
                      convert, needs=("wiki_pages",))
