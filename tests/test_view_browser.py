"""`fae view` in a real browser: headless Chromium opens the viewer of two real `fae run`s (the demo's
shipped base model on demo test claims; the second run cut off at 4 tokens), applies filters,
opens claim pages and checks what is rendered against claims.jsonl and the records.

Screenshots land in pytest's tmp directory (``view-screens/``), or in ``$FAE_VIEW_ARTIFACTS``
when set. Chromium: /usr/bin/chromium (or ``$FAE_VIEW_CHROMIUM``); on a machine without it, as
root with apt, the session fixture installs the Debian package; otherwise the tests skip, saying why.
"""

from __future__ import annotations

import json
import random

import pytest

from data_prep.records import load_records, save_records
from fae.ablation.metrics import is_flip, round_label, same_label
from fae.cli import main as fae
from fae.view.browser import Chromium
from view_helpers import chromium, screens  # noqa: F401  (fixtures: the browser, where screenshots go)

pytestmark = pytest.mark.slow


N_CLAIMS, ROUNDS = 24, 3


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two real runs of the shipped demo base on demo test claims: 16 claims of the world it was built
    on (it answers them), 8 of another world (words it does not know: invalid and cut-off answers),
    and one NEI-gold record (left out). The second run stops at 4 tokens: every answer is cut off."""
    from real.demo.pipeline import BASE_DIR, DemoSize, write_world_records

    tmp = tmp_path_factory.mktemp("view-runs")
    _, known = write_world_records(tmp / "w0", DemoSize(n_train=1, n_test=N_CLAIMS - 8), seed=0)
    _, other = write_world_records(tmp / "w3", DemoSize(n_train=1, n_test=8), seed=3)
    recs = [r.to_dict() for r in load_records(known)]
    recs += [r.to_dict() | {"id": r.id.replace("demo-test", "other-world")} for r in load_records(other)]
    recs.append(recs[0] | {"id": "nei-gold-0", "label": "NOT_ENOUGH_INFO", "evidence": []})
    test = tmp / "test.jsonl"
    save_records(recs, test)
    runs = {}
    for name, tokens in (("base", 16), ("cut", 4)):  # an answer is 4-5 tokens
        runs[name] = tmp / name
        assert fae(["run", "--records", str(test), "--output", str(runs[name]), "--backend", "hf",
                    "--model", str(BASE_DIR), "--rounds", str(ROUNDS), "--batch-size", "32", "--max-new-tokens", str(tokens),
                    "--no-progress"]) == 0
    site = tmp / "site"
    assert fae(["view", str(runs["base"]), str(runs["cut"]), "--output", str(site), "--names", "base", "cut",
                "--shard-size", "5"]) == 0
    claims = {n: [json.loads(x) for x in (d / "claims.jsonl").read_text().splitlines()] for n, d in runs.items()}
    metrics = {n: json.loads((d / "metrics.json").read_text()) for n, d in runs.items()}
    return {"site": site, "claims": claims, "metrics": metrics, "records": {r.id: r for r in load_records(test)}}


@pytest.fixture(scope="module")
def page(chromium, two_runs):
    with Chromium(chromium, width=1400, height=1000) as b:
        b.open((two_runs["site"] / "index.html").as_uri())
        b.wait_for("document.body.dataset.state === 'ready'")
        yield b
        b.evaluate("1")
        assert b.page_errors() == []


def show(b: Chromium, hash_: str) -> None:
    b.evaluate(f"location.hash = {json.dumps(hash_)}")
    b.wait_for(f"document.body.dataset.state === 'ready' && document.body.dataset.route === {json.dumps(hash_)}")


def listed_ids(b: Chromium) -> list[str]:
    return b.evaluate("[...document.querySelectorAll('table.claims tbody tr')].map(tr => tr.dataset.claim)")


def test_run_table_numbers_link_to_the_claims_behind_them(page, two_runs, screens):
    show(page, "#run=0&r=1")
    page.screenshot(screens / "index.png", full_page=False)
    for k, name in enumerate(("base", "cut")):
        m = two_runs["metrics"][name]
        n = m["n_claims"]
        links = page.evaluate(f"[...document.querySelectorAll('table.runs tr[data-run=\"{k}\"] a')]"
                              ".map(a => [a.getAttribute('href'), +a.dataset.count])")
        counts = dict(links)
        for r, a in enumerate(m["round_accuracy"]):
            assert counts[f"#run={k}&r={r}&ans=correct"] == round(a * n)
        for r, x in enumerate(m["invalid_rate"]):
            assert counts[f"#run={k}&r={r}&ans=invalid"] == round(x * n)
        assert counts[f"#run={k}&r=1"] == n
        assert counts[f"#run={k}&r=1&set=excluded"] == m["n_excluded_nei"] == 1
        assert counts[f"#run={k}&r=1&flags=flipped"] == round(m["any_flip_rate"] * n)
        assert counts[f"#run={k}&r=0&flags=strict"] == round(m["strict_accuracy"] * n)
    # follow IS's link: the claims that keep the gold label at round 1, exactly those of claims.jsonl
    href = page.evaluate("document.querySelector('table.runs tr[data-run=\"1\"] td:nth-child(8) a')"
                         ".getAttribute('href')")
    assert href == "#run=1&r=1&ans=correct"
    page.evaluate(f"document.querySelector('a[href=\"{href}\"]').click()")
    page.wait_for(f"document.body.dataset.route === {json.dumps(href)} && document.body.dataset.state === 'ready'")
    kept = [c["id"] for c in two_runs["claims"]["cut"] if same_label(round_label(c["rounds"][1]), c["gold_label"])]
    assert listed_ids(page) == kept and page.evaluate("+document.getElementById('count').dataset.count") == len(kept)


def test_filters_applied_in_the_page_select_what_claims_jsonl_says(page, two_runs, screens):
    show(page, "#run=0&r=1")
    claims = two_runs["claims"]["cut"]
    # through the controls, as a user does: filter on run "cut", any round cut off
    page.evaluate("(() => { const s = document.getElementById('f-run'); s.value = '1';"
                  " s.dispatchEvent(new Event('change')); })()")
    page.wait_for("document.body.dataset.route === '#run=1&r=1'")
    page.evaluate("document.getElementById('f-flag-truncated').click()")
    page.wait_for("document.body.dataset.route === '#run=1&r=1&flags=truncated'")
    cut = [c["id"] for c in claims if any(rd.get("truncated") for rd in c["rounds"])]
    assert 0 < len(cut) <= N_CLAIMS
    assert listed_ids(page) == cut
    page.screenshot(screens / "filter-cut-off.png", full_page=False)
    # invalid at round 2, flipped, gold label, NEI-gold, text search
    show(page, "#run=1&r=2&ans=invalid")
    assert listed_ids(page) == [c["id"] for c in claims if round_label(c["rounds"][2]) is None]
    show(page, "#run=1&r=1&flags=flipped")
    assert listed_ids(page) == [c["id"] for c in claims if any(
        is_flip(round_label(a), round_label(b)) for a, b in zip(c["rounds"], c["rounds"][1:]))]
    show(page, "#run=0&r=1&gold=1")
    assert listed_ids(page) == [c["id"] for c in two_runs["claims"]["base"] if c["gold_label"] == "REFUTE"]
    show(page, "#run=0&r=1&set=excluded")
    assert listed_ids(page) == ["nei-gold-0"]
    word = two_runs["records"][claims[0]["id"]].claim.split()[3]
    show(page, f"#run=0&r=1&q={word}")
    assert listed_ids(page) == [c["id"] for c in two_runs["claims"]["base"]
                                if word.lower() in (c["id"] + " " + two_runs["records"][c["id"]].claim).lower()]
    # sorted by P(gold) drop from round 0 to round 1, largest first
    show(page, "#run=0&r=1&sort=drop")
    def p_gold(c, r):
        probs = c["rounds"][r].get("label_probs")
        return None if probs is None else probs[c["gold_label"]]

    drops = {c["id"]: None if p_gold(c, 0) is None or p_gold(c, 1) is None else p_gold(c, 0) - p_gold(c, 1)
             for c in two_runs["claims"]["base"]}
    listed = listed_ids(page)
    with_drop = [drops[i] for i in listed if drops[i] is not None]
    assert sorted(listed) == sorted(drops) and with_drop  # every claim, those without probabilities last
    assert [drops[i] is None for i in listed] == sorted(drops[i] is None for i in listed)
    assert all(x >= y - 2e-4 for x, y in zip(with_drop, with_drop[1:]))  # the index keeps 4 decimals


RENDERED = """(() => [...document.querySelectorAll('.round[data-run]')].map(div => {
  const lis = [...div.querySelectorAll('ol.pool li')];
  const struck = lis.filter(li => { const s = li.querySelector('s');
    return s && getComputedStyle(s).textDecorationLine.includes('line-through'); });
  const marked = lis.filter(li => { const m = li.querySelector('mark');
    return m && getComputedStyle(m).backgroundColor !== 'rgba(0, 0, 0, 0)'; });
  return {run: +div.dataset.run, round: +div.dataset.round,
          label: div.querySelector('.parsed-label').textContent,
          struck: struck.map(li => [+li.dataset.sid, li.querySelector('s').textContent]),
          cited: marked.map(li => [+li.dataset.sid, li.querySelector('mark').textContent]),
          shown: lis.map(li => +li.dataset.sid),
          raw: div.querySelector('pre.raw').textContent};
}))()"""


def test_claim_pages_show_struck_and_cited_lines_and_labels_of_claims_jsonl(page, two_runs, screens):
    names = ("base", "cut")
    by_id = {n: {c["id"]: c for c in two_runs["claims"][n]} for n in names}
    ids = random.Random(27).sample(sorted(by_id["base"]), 10)
    seen = {"struck": 0, "cited": 0, "invalid": 0}
    for cid in ids:
        show(page, f"#claim={cid}&run=0&r=1")
        rec = two_runs["records"][cid]
        text = {s.id: s.text for s in rec.sentences}
        assert page.evaluate("document.getElementById('claim-text').textContent") == rec.claim
        assert page.evaluate("document.getElementById('gold-label').textContent") == rec.label
        rendered = page.evaluate(RENDERED)
        assert len(rendered) == 2 * (ROUNDS + 1)  # two runs side by side, every round
        for cell in rendered:
            rd = by_id[names[cell["run"]]][cid]["rounds"][cell["round"]]
            removed = [i for i in rec.pool_ids if i not in rd["pool_ids"]]
            assert cell["shown"] == rec.pool_ids
            assert cell["struck"] == [[i, text[i]] for i in removed], (cid, cell)
            assert cell["cited"] == [[i, text[i]] for i in rec.pool_ids if i in rd["cited"]], (cid, cell)
            assert cell["label"] == (round_label(rd) or "invalid")
            assert cell["raw"] == rd["raw_output"]
            seen["struck"] += len(cell["struck"])
            seen["cited"] += len(cell["cited"])
            seen["invalid"] += cell["label"] == "invalid"
        page.screenshot(screens / f"claim-{cid}.png")
    assert min(seen.values()) > 0, seen  # the pages checked show struck, cited lines and invalid answers
    # the page navigates within the selection
    show(page, f"#claim={ids[0]}&run=0&r=1")
    page.evaluate("document.getElementById('next').click()")
    order = [c["id"] for c in two_runs["claims"]["base"]]
    nxt = order[order.index(ids[0]) + 1]
    page.wait_for(f"document.body.dataset.route === {json.dumps(f'#claim={nxt}&run=0&r=1')}"
                  " && document.body.dataset.state === 'ready'")
    assert page.evaluate("document.getElementById('claim-id').textContent") == nxt
