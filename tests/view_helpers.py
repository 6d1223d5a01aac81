"""What the viewer tests share: view.js run under node with a minimal DOM (:func:`render`), and the headless
Chromium and screenshot folder fixtures of the browser tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fae.view.browser import find_chromium


NODE = shutil.which("node") or shutil.which("nodejs")
DOM_JS = r"""
// A minimal DOM for running fae/view/assets/view.js under node (no browser): enough for the run table,
// the claim list and the claim page. Usage: node dom.js SITE_DIR '["#hash", ...]' -> JSON per hash.
const fs = require("fs"), path = require("path"), vm = require("vm");
const site = process.argv[2], hashes = JSON.parse(process.argv[3]);
const camel = s => s.replace(/-([a-z])/g, (_, c) => c.toUpperCase());
class N {
  constructor(tag) { this.tag = tag; this.attrs = {}; this.children = []; this.dataset = {}; this.className = ""; this.style = {}; }
  appendChild(c) { this.children.push(c); if (this.onappend) this.onappend(c); return c; }
  replaceChildren(...cs) { this.children = cs; }
  setAttribute(k, v) { v = String(v); this.attrs[k] = v; if (k === "class") this.className = v;
                       if (k.startsWith("data-")) this.dataset[camel(k.slice(5))] = v; }
  getAttribute(k) { return k in this.attrs ? this.attrs[k] : null; }
  get textContent() { return this.children.map(c => c.textContent).join(""); }
  set textContent(v) { this.children = [{tag: "#text", textContent: String(v), children: []}]; }
}
function walk(n, fn, out) { out = out || []; if (n.tag !== "#text") { if (fn(n)) out.push(n); n.children.forEach(c => walk(c, fn, out)); } return out; }
const app = new N("main"), where = new N("span"), head = new N("head"), body = new N("body");
body.children = [where, app];
let hash = "", listeners = [];
const location = {get hash() { return hash; }, set hash(v) { v = String(v); hash = v.startsWith("#") ? v : "#" + v; listeners.forEach(f => f()); }};
head.onappend = s => {
  const file = path.join(site, s.src);
  if (fs.existsSync(file)) vm.runInContext(fs.readFileSync(file, "utf8"), ctx); else s.onerror();
};
const document = {
  head, body, title: "",
  createElement: t => new N(t), createElementNS: (_, t) => new N(t),
  createTextNode: t => ({tag: "#text", textContent: String(t), children: []}),
  getElementById: id => id === "app" ? app : id === "where" ? where : walk(app, n => n.attrs.id === id)[0] || null,
};
const ctx = vm.createContext({document, location, performance, console,
  history: {replaceState: (_, __, h) => { hash = h.startsWith("#") ? h : "#" + h; }},
  addEventListener: (ev, f) => { if (ev === "hashchange") listeners.push(f); }});
ctx.window = ctx;
vm.runInContext(fs.readFileSync(path.join(site, "assets/view.js"), "utf8"), ctx);
vm.runInContext(fs.readFileSync(path.join(site, "data/index.js"), "utf8"), ctx);
const out = [];
for (const h of hashes) {
  location.hash = h;
  const cls = n => " " + n.className + " ";
  const table = walk(app, n => n.tag === "table" && n.className === "runs")[0];
  const runs = table ? walk(table, n => n.tag === "tr" && n.dataset.run !== undefined) : [];
  const head = table ? walk(table.children[0], n => n.tag === "th").map(n => n.textContent) : null;
  out.push({
    hash: h,
    head,
    runs: runs.map(tr => ({cells: tr.children.map(td => td.textContent),
                           titles: tr.children.map(td => td.attrs.title || walk(td, x => x.attrs.title)[0]?.attrs.title || null),
                           links: walk(tr, a => a.tag === "a").map(a => [a.attrs.href, +a.attrs["data-count"]])})),
    flags: walk(app, n => n.tag === "input" && (n.attrs.id || "").startsWith("f-flag-")).map(n => n.attrs.id.slice(7)),
    listed: walk(app, n => n.tag === "tr" && n.dataset.claim !== undefined).map(n => n.dataset.claim),
    rounds: walk(app, n => cls(n).includes(" round ") && n.dataset.run !== undefined)
      .map(n => ({run: +n.dataset.run, round: +n.dataset.round})),
    arms: walk(app, n => cls(n).includes(" arm ") && n.dataset.run !== undefined).map(n => ({
      run: +n.dataset.run, round: +n.dataset.armRound, cls: n.className, text: n.textContent,
      label: (walk(n, x => cls(x).includes(" arm-label "))[0] || {textContent: null}).textContent,
      struck: walk(n, x => x.tag === "li" && cls(x).includes(" removed ")).map(x => +x.dataset.sid),
      cited: walk(n, x => x.tag === "li" && cls(x).includes(" cited ")).map(x => +x.dataset.sid),
      shown: walk(n, x => x.tag === "li").map(x => +x.dataset.sid),
      arm: n.dataset.arm || null, k: n.dataset.k === undefined ? null : +n.dataset.k})),
    chips: Object.fromEntries(walk(app, n => n.tag === "tr" && n.dataset.claim !== undefined).map(tr =>
      [tr.dataset.claim, tr.children.slice(3).map(td => walk(td, x => cls(x).includes(" chip "))
        .map(x => x.className + ":" + x.textContent))])),
    pools: walk(app, n => n.tag === "select" && n.attrs.id === "f-pool").flatMap(n => n.children.map(o => o.attrs.value)),
    select: vm.runInContext("FAE_VIEW.select(" + JSON.stringify(h) + ")", ctx),
  });
}
process.stdout.write(JSON.stringify(out));
"""


def render(site: Path, hashes: list[str], tmp_path: Path) -> list[dict]:
    """What view.js puts on the page for each hash, run under node with a minimal DOM (no browser)."""
    if NODE is None:
        pytest.skip("no node to run view.js")
    harness = tmp_path / "dom.js"
    harness.write_text(DOM_JS)
    done = subprocess.run([NODE, str(harness), str(site), json.dumps(hashes)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _apt_install_chromium() -> str:
    """Install the Debian package (root with apt only); what happened, for the skip reason."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
        return "not root with apt-get"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
                ["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(cmd)} failed: {exc}"
        if cmd[1] == "install" and done.returncode == 0:
            return "installed"
    return f"apt-get install chromium failed: {done.stderr.strip().splitlines()[-1:]}"


@pytest.fixture(scope="session")
def chromium(tmp_path_factory) -> str:
    path = find_chromium()
    if path is None:
        # one install at a time: pytest-xdist workers share the run's base temp folder's parent, and a second
        # apt-get beside the first fails on dpkg's lock (the worker then finds the first one's Chromium)
        from filelock import FileLock

        with FileLock(str(tmp_path_factory.getbasetemp().parent / "chromium-install.lock")):
            path = find_chromium()
            why = _apt_install_chromium() if path is None else "installed"
            path = path or find_chromium()
        if path is None:
            pytest.skip(f"no Chromium for the viewer tests ({why}); install the Debian package `chromium`")
    return path


@pytest.fixture(scope="session")
def screens(tmp_path_factory) -> Path:
    where = os.environ.get("FAE_VIEW_ARTIFACTS")
    out = Path(where) if where else tmp_path_factory.mktemp("view-screens")
    out.mkdir(parents=True, exist_ok=True)
    return out
