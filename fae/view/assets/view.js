/* fae view: a static per-claim ablation explorer (docs/view.md). Plain JavaScript, no dependencies.
 *
 * data/index.js calls FAE_VIEW.index({...}): per claim a short summary (see fae/view/data.py).
 * data/claims/NNNNN.js calls FAE_VIEW.shard(k, [...]): the details of claims k*S .. k*S+S-1,
 * loaded by a <script> tag when a claim opens (browsers refuse to fetch local files).
 * The whole state lives in the URL hash, so every view is a link: #run=0&r=1&ans=correct,
 * #claim=ID. Text from the runs is only ever set as textContent, never parsed as HTML.
 * Beside the ablation a run may have asked a control arm (rounds 1..R: the full pool minus as many
 * lines as the ablation removed, none of them cited or gold) and a gold-only pool (SPEC §6): the claim
 * page shows them in a column beside each run's rounds; runs without them show only the rounds. The
 * sufficiency arms, a cited-only pool (round 0's cited lines alone) and a size sweep (the gold lines plus
 * k other lines, k = 0, 1, ...), follow the rounds, one panel per pool. The answer filter reads the
 * ablation's round r, or one arm's pool (#pool=gold, pool=cited, pool=k3: the sweep's pool k = 3).
 */
(function () {
  "use strict";
  var IX = null;            // the index
  var shards = {};          // k -> array of claim details
  var waiting = {};         // k -> [callbacks]
  var PAGE = 100;
  var ANSWERS = [
    ["any", "any answer"], ["correct", "gold label (kept)"], ["lost", "lost the gold label (correct at round 0, not at r)"],
    ["wrong", "not the gold label"], ["S", "SUPPORT"], ["R", "REFUTE"], ["N", "NOT_ENOUGH_INFO"],
    ["invalid", "invalid"], ["truncated", "cut off at max_new_tokens"], ["hallucinated", "hallucinated ids"],
    ["reused", "reused (pool unchanged)"]];
  var FLAGS = [
    ["flipped", "flipped SUPPORT\u2194REFUTE"], ["invalid", "invalid answer (any round)"],
    ["truncated", "cut off (any round)"], ["hallucinated", "hallucinated ids (any round)"],
    ["strict", "strict at round 0"], ["disagree", "runs disagree at round r"],
    ["ctrl_nei1", "abstained on the control at round 1"], ["gold_nei", "abstained on gold-only"],
    ["cited_nei", "abstained on cited-only"], ["sweep_nei", "abstained somewhere in the size sweep"]];
  // shown when some run asked that arm
  var ARM_FLAGS = {ctrl_nei1: "control", gold_nei: "gold_only", cited_nei: "cited_only", sweep_nei: "size_sweep"};
  // the answers the filter can read on an arm's pool (the index holds its label code only)
  var POOL_ANSWERS = {any: 1, correct: 1, lost: "lost the gold label (correct at round 0, not on this pool)",
                      wrong: 1, S: 1, R: 1, N: 1, invalid: 1};
  var GOLD_CODE = {SUPPORT: "S", REFUTE: "R", NOT_ENOUGH_INFO: "N"};
  var CODE_NAME = {S: "SUPPORT", R: "REFUTE", N: "NOT_ENOUGH_INFO", x: "invalid", "?": "other", "-": "left out"};
  var timing = {};

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) {
      if (attrs[k] === null || attrs[k] === undefined) continue;
      if (k === "text") e.textContent = attrs[k];
      else if (k === "cls") e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    (children || []).forEach(function (c) {
      if (c === null || c === undefined) return;
      e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return e;
  }
  var SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function pct(x) { return x === null || x === undefined ? "n/a" : (100 * x).toFixed(2); }
  function hasArm(arm) { return IX.runs.some(function (run) { return run.arms && run.arms[arm]; }); }
  var widest = null;
  function sweepWidth() {   // the most size-sweep pools any claim of any run has
    if (widest === null) {
      widest = 0;
      IX.answers.forEach(function (A) { (A.sweep || []).forEach(function (s) {
        if (s && s !== "-" && s.length > widest) widest = s.length;
      }); });
    }
    return widest;
  }
  function poolName(pool) {
    return pool === "gold" ? "the gold-only pool" : pool === "cited" ? "the cited-only pool"
      : "the size sweep's pool k = " + pool.slice(1);
  }

  // ---------------------------------------------------------------- state in the hash
  function parseHash() {
    var s = {}, h = location.hash.replace(/^#/, "");
    h.split("&").forEach(function (kv) {
      if (!kv) return;
      var i = kv.indexOf("="), k = i < 0 ? kv : kv.slice(0, i), v = i < 0 ? "" : kv.slice(i + 1);
      s[decodeURIComponent(k)] = decodeURIComponent(v);
    });
    var R = IX.rounds;
    return {
      claim: s.claim === undefined ? null : s.claim,
      run: Math.min(Math.max(parseInt(s.run || "0", 10) || 0, 0), IX.runs.length - 1),
      r: Math.min(Math.max(parseInt(s.r === undefined ? (R >= 1 ? "1" : "0") : s.r, 10) || 0, 0), R),
      ans: s.ans || "any",
      pool: /^(gold|cited|k\d+)$/.test(s.pool || "") ? s.pool : "",
      flags: (s.flags || "").split(",").filter(Boolean),
      set: s.set || "evaluated",
      ds: s.ds === undefined ? "" : s.ds,
      gold: s.gold === undefined ? "" : s.gold,
      q: s.q || "",
      sort: s.sort || "order",
      page: Math.max(parseInt(s.page || "0", 10) || 0, 0)
    };
  }
  function listHash(st, over) {
    var o = {}, k;
    for (k in st) o[k] = st[k];
    for (k in (over || {})) o[k] = over[k];
    var parts = [];
    if (o.claim !== null && o.claim !== undefined) parts.push("claim=" + encodeURIComponent(o.claim));
    parts.push("run=" + o.run, "r=" + o.r);
    if (o.pool) parts.push("pool=" + o.pool);
    if (o.ans !== "any") parts.push("ans=" + o.ans);
    if (o.flags.length) parts.push("flags=" + o.flags.join(","));
    if (o.set !== "evaluated") parts.push("set=" + o.set);
    if (o.ds !== "") parts.push("ds=" + o.ds);
    if (o.gold !== "") parts.push("gold=" + o.gold);
    if (o.q) parts.push("q=" + encodeURIComponent(o.q));
    if (o.sort !== "order") parts.push("sort=" + o.sort);
    if (o.page) parts.push("page=" + o.page);
    return "#" + parts.join("&");
  }
  function go(hash) { if (location.hash !== hash) location.hash = hash; else route(); }

  // ---------------------------------------------------------------- filtering
  var lowerText = null;
  function bit(mask, r) { return (mask >>> r) & 1; }
  function answerAt(A, i, r, ans) {
    var code = A.labels[i].charAt(r);
    if (!code) return false;
    switch (ans) {
      case "any": return true;
      case "correct": return bit(A.correct[i], r) === 1;
      case "wrong": return bit(A.correct[i], r) === 0;
      case "lost": return bit(A.correct[i], 0) === 1 && bit(A.correct[i], r) === 0;
      case "invalid": case "truncated": case "hallucinated": case "reused": return bit(A[ans][i], r) === 1;
      default: return code === ans;
    }
  }
  /* The label code of claim i's answer on an arm's pool ("gold", "cited", "kK"); "" where it has none. */
  function poolCode(A, i, pool) {
    var s = (pool === "gold" ? A.gold_only : pool === "cited" ? A.cited_only : A.sweep) || [];
    var c = pool.charAt(0) === "k" ? (s[i] || "").charAt(+pool.slice(1)) : (s[i] || "");
    return c === "-" ? "" : c;
  }
  function answerOn(A, i, pool, ans) {
    var c = poolCode(A, i, pool), g = GOLD_CODE[IX.labels[IX.claims.gold[i]]];
    if (!c) return false;
    switch (ans) {
      case "any": return true;
      case "correct": return c === g;
      case "wrong": return c !== g;
      case "lost": return bit(A.correct[i], 0) === 1 && c !== g;
      case "invalid": return c === "x";
      case "S": case "R": case "N": return c === ans;
      default: return false;
    }
  }
  function drop(A, i, r) {
    var p = A.p_gold[i];
    if (!p || p[0] === null || p[r] === null || p[r] === undefined) return null;
    return p[0] - p[r];
  }
  function disagree(i, r) {
    var seen = null, n = 0;
    for (var k = 0; k < IX.answers.length; k++) {
      var c = IX.answers[k].labels[i].charAt(r);
      if (!c) continue;
      n++;
      if (seen === null) seen = c; else if (c !== seen) return true;
    }
    return false;
  }
  /* The claim indices the state selects, in display order. */
  function select(st) {
    var C = IX.claims, A = IX.answers[st.run], n = IX.n_claims, out = [];
    var q = st.q.trim().toLowerCase(), words = q ? q.split(/\s+/) : [];
    if (words.length && !lowerText) {
      lowerText = C.text.map(function (t, i) { return (C.id[i] + " " + t).toLowerCase(); });
    }
    var ds = st.ds === "" ? -1 : +st.ds, gold = st.gold === "" ? -1 : +st.gold;
    var f = {}; st.flags.forEach(function (x) { f[x] = true; });
    for (var i = 0; i < n; i++) {
      var excluded = C.excluded[i] === 1;
      if (st.set === "evaluated" && (excluded || !A.labels[i])) continue;
      if (st.set === "excluded" && (!excluded || !A.known[i])) continue;
      if (ds >= 0 && C.dataset[i] !== ds) continue;
      if (gold >= 0 && C.gold[i] !== gold) continue;
      if (st.pool) { if (!answerOn(A, i, st.pool, st.ans)) continue; }
      else if (st.ans !== "any" && !answerAt(A, i, st.r, st.ans)) continue;
      if (f.flipped && !A.flipped[i]) continue;
      if (f.strict && !A.strict[i]) continue;
      if (f.invalid && !A.invalid[i]) continue;
      if (f.truncated && !A.truncated[i]) continue;
      if (f.hallucinated && !A.hallucinated[i]) continue;
      if (f.disagree && !disagree(i, st.r)) continue;
      if (f.ctrl_nei1 && (!A.ctrl || A.ctrl[i].charAt(1) !== "N")) continue;
      if (f.gold_nei && (!A.gold_only || A.gold_only[i] !== "N")) continue;
      if (f.cited_nei && (!A.cited_only || A.cited_only[i] !== "N")) continue;
      if (f.sweep_nei && (!A.sweep || A.sweep[i].indexOf("N") < 0)) continue;
      if (words.length) {
        var t = lowerText[i], ok = true;
        for (var w = 0; w < words.length; w++) if (t.indexOf(words[w]) < 0) { ok = false; break; }
        if (!ok) continue;
      }
      out.push(i);
    }
    if (st.sort === "drop" || st.sort === "rise") {
      var sign = st.sort === "drop" ? -1 : 1, d = {};
      out.forEach(function (i) { d[i] = drop(A, i, st.r); });
      out.sort(function (a, b) {
        var x = d[a], y = d[b];
        if (x === null && y === null) return a - b;
        if (x === null) return 1;
        if (y === null) return -1;
        return sign * (x - y) || a - b;
      });
    }
    return out;
  }

  // ---------------------------------------------------------------- run table
  function countLink(st, over, text, what) {
    var target = {}, k;
    for (k in st) target[k] = st[k];
    target.claim = null; target.page = 0; target.flags = []; target.ans = "any"; target.set = "evaluated";
    target.q = ""; target.ds = ""; target.gold = ""; target.sort = "order"; target.pool = "";
    for (k in over) target[k] = over[k];
    var n = select(target).length;
    return el("a", {href: listHash(target), title: n + " claims: " + what, "data-count": n,
                    cls: "num"}, [text]);
  }
  function roundCells(st, k, xs, ans, what) {
    var cells = [];
    (xs || []).forEach(function (x, r) {
      if (r) cells.push(" / ");
      cells.push(ans ? countLink(st, {run: k, r: r, ans: ans}, pct(x), what + " at round " + r) : pct(x));
    });
    return el("td", {}, cells.length ? cells : ["n/a"]);
  }
  var tables = {};   // the run table per round selected: its counts do not depend on the filters
  function runTable(st) {
    if (!tables[st.r]) tables[st.r] = buildRunTable(st);
    return tables[st.r];
  }
  function buildRunTable(st) {
    var head = ["run", "claims", "Prec", "Rec", "F1", "Acc", "Strict", "IS", "ER", "IO", "IS_ctrl [95%]",
                "IS \u2212 IS_ctrl [95%]", "NEI on control r1", "gold-only Acc", "gold-only NEI", "cited-only Acc", "cited-only NEI",
                "sweep lowest Acc", "sweep Acc by k (k = 0 / 1 / \u2026)", "a_r (r = 0 / 1 / \u2026)",
                "any flip", "invalid", "NOT_ENOUGH_INFO answers", "cut off", "halluc. ids r0", "soft IS",
                "P(gold)", "NEI-gold excluded"];
    var tbody = el("tbody");
    IX.runs.forEach(function (run, k) {
      var m = run.metrics, R = m.rounds, soft = m.soft || {}, undef = m.IS_reason;
      var score = function (key, over, what) {
        return el("td", {}, [undef ? el("span", {title: undef, text: "n/a"}) :
                             countLink(st, over, pct(m[key]), what)]);
      };
      tbody.appendChild(el("tr", {"data-run": k}, [
        el("th", {title: [run.backend, run.model, run.adapter, run.dir,
                          run.line_ids ? "line ids " + run.line_ids : null].filter(Boolean).join(" \u00b7 ")},
           [run.name]),
        el("td", {}, [countLink(st, {run: k}, String(m.n_claims), "evaluated (gold SUPPORT/REFUTE)")]),
        el("td", {text: pct(m.evidence_precision)}), el("td", {text: pct(m.evidence_recall)}),
        el("td", {text: pct(m.evidence_f1)}),
        el("td", {}, [countLink(st, {run: k, r: 0, ans: "correct"}, pct(m.label_accuracy), "gold label at round 0")]),
        el("td", {}, [countLink(st, {run: k, r: 0, flags: ["strict"]}, pct(m.strict_accuracy),
                                "gold label and a gold line cited at round 0")]),
        score("IS", {run: k, r: Math.min(1, R), ans: "correct"},
              "keep the gold label at round 1 (IS = 1 \u2212 their share / a_0)"),
        score("ER", {run: k, r: R, ans: "correct"}, "keep the gold label at round R (ER = 1 \u2212 their share / a_0)"),
        el("td", {text: undef ? "n/a" : pct(m.IO)})].concat(armCells(st, k, m), [
        roundCells(st, k, m.round_accuracy, "correct", "gold label"),
        el("td", {}, [countLink(st, {run: k, flags: ["flipped"]}, pct(m.any_flip_rate),
                                "flip SUPPORT\u2194REFUTE at least once")]),
        roundCells(st, k, m.invalid_rate, "invalid", "invalid answer"),
        roundCells(st, k, m.nei_answer_rate, "N", "NOT_ENOUGH_INFO answer"),
        roundCells(st, k, m.truncated_rate, "truncated", "cut off"),
        el("td", {}, [countLink(st, {run: k, r: 0, ans: "hallucinated"}, pct((m.hallucinated_id_rate || [null])[0]),
                                "with hallucinated ids at round 0 (the rate is over ids)")]),
        el("td", {text: pct(soft.soft_IS)}),
        roundCells(st, k, soft.p_gold, null, ""),
        el("td", {}, [countLink(st, {run: k, set: "excluded"}, String(m.n_excluded_nei || 0),
                                "gold NOT_ENOUGH_INFO, not evaluated (SPEC \u00a71)")])
      ])));
    });
    return el("table", {cls: "runs"}, [el("thead", {}, [el("tr", {}, head.map(function (h) {
      return el("th", {text: h});
    }))]), tbody]);
  }

  /* The control arm's and the gold-only pool's cells of a run (metrics.json's control / gold_only blocks,
   * fae.ablation.control): n/a, with the reason on hover, where the run did not ask them. */
  function interval(block, key) {
    var iv = (block.intervals || {})[key] || {};
    return iv.ci_low === null || iv.ci_low === undefined ? "" : " [" + pct(iv.ci_low) + ", " + pct(iv.ci_high) + "]";
  }
  function armCells(st, k, m) {
    var ctrl = m.control, gold = m.gold_only, na = function (why, cls) {
      return el("td", {cls: cls}, [el("span", {title: why, text: "n/a"})]);
    };
    var noCtrl = "no control arm in this run (fae run --control none, or a run made before it existed)";
    var noGold = "no gold-only pools in this run (fae run --no-gold-only, or a run made before they existed)";
    var cells = [];
    if (!ctrl) cells.push(na(noCtrl, "is-ctrl"), na(noCtrl, "is-diff"), na(noCtrl, "ctrl-nei"));
    else {
      var over = "over the " + ctrl.n_control_claims + " claims with a round-1 control (" +
        ((ctrl.n_left_out || [0])[0] || 0) + " left out: too few lines neither cited nor gold); IS on the same claims " +
        pct(ctrl.IS) + interval(ctrl, "IS");
      var ivs = ctrl.intervals || {}, noIv = (ivs.IS_minus_IS_ctrl || {}).reason;
      if (noIv) over += "; no interval: " + noIv;
      else if (ivs.method) over += "; " + Math.round(100 * (ivs.confidence_level || 0.95)) + "% " + ivs.method +
        " (" + ivs.n_resamples + " resamples, seed " + ivs.seed + ")";
      var gap = ctrl.gap, gm = ctrl.gap_matched;
      if (gap && gap.n_unmatched && gap.n_unmatched.length) over += "; " + gap.n_unmatched[0] +
        " round-1 controls could not leave the ablation's gap in the numbering";
      if (gm) over += "; over the " + gm.n_claims + " gap-matched claims IS \u2212 IS_ctrl " +
        pct(gm.IS_minus_IS_ctrl) + interval(gm, "IS_minus_IS_ctrl");
      var why = ctrl.IS_ctrl_reason;
      cells.push(why ? na(why, "is-ctrl") : el("td", {cls: "is-ctrl", title: over,
                                                     text: pct(ctrl.IS_ctrl) + interval(ctrl, "IS_ctrl")}));
      cells.push(why ? na(why, "is-diff") : el("td", {cls: "is-diff", title: "the part of IS that is evidence, " + over,
                                                     text: pct(ctrl.IS_minus_IS_ctrl) + interval(ctrl, "IS_minus_IS_ctrl")}));
      var nei1 = (ctrl.nei_answer_rate_ctrl || [null])[0];
      cells.push(nei1 === null || nei1 === undefined ? na("no claim has a control at round 1", "ctrl-nei") :
        el("td", {cls: "ctrl-nei"}, [countLink(st, {run: k, r: Math.min(1, IX.rounds), flags: ["ctrl_nei1"]}, pct(nei1),
          "abstained (NOT_ENOUGH_INFO) on the control pool of round 1 (the share is over the claims with one)")]));
    }
    if (!gold) cells.push(na(noGold, "gold-acc"), na(noGold, "gold-nei"));
    else {
      var note = "over the " + gold.n_claims + " claims with gold sentences (" + gold.n_skipped + " left out); " +
        "round 0 on the same claims " + pct(gold.round0_label_accuracy);
      cells.push(el("td", {cls: "gold-acc", title: note}, [countLink(st, {run: k, r: 0, pool: "gold", ans: "correct"},
        pct(gold.label_accuracy), "gold label on the gold sentences alone (" + note + ")")]));
      cells.push(el("td", {cls: "gold-nei"}, [countLink(st, {run: k, r: 0, flags: ["gold_nei"]}, pct(gold.nei_answer_rate),
        "abstained (NOT_ENOUGH_INFO) on the gold sentences alone (" + note + ")")]));
    }
    var cited = m.cited_only, sweep = m.size_sweep;
    var noCited = "no cited-only pools in this run (fae run --no-cited-only, or a run made before they existed)";
    var noSweep = "no size sweep in this run (fae run --no-size-sweep, or a run made before it existed)";
    if (!cited) cells.push(na(noCited, "cited-acc"), na(noCited, "cited-nei"));
    else {
      var why = "over the " + cited.n_claims + " claims asked on the lines their round-0 answer cited, alone (" +
        cited.n_skipped + " left out: an invalid round 0 or no line cited); round 0 on the same claims " +
        pct(cited.round0_label_accuracy) + "; of the " + cited.n_round0_right + " right at round 0, " +
        pct(cited.kept_rate) + " still right";
      cells.push(el("td", {cls: "cited-acc", title: why}, [countLink(st, {run: k, r: 0, pool: "cited", ans: "correct"},
        pct(cited.label_accuracy), "gold label on the lines round 0 cited, alone (" + why + ")")]));
      cells.push(el("td", {cls: "cited-nei", title: why}, [countLink(st, {run: k, r: 0, flags: ["cited_nei"]},
        pct(cited.nei_answer_rate), "abstained (NOT_ENOUGH_INFO) on the lines round 0 cited, alone (" + why + ")")]));
    }
    if (!sweep) cells.push(na(noSweep, "sweep-min"), na(noSweep, "sweep-acc"));
    else {
      var rows = sweep.per_k || [], low = null;
      rows.forEach(function (row) {
        if (row.label_accuracy !== null && row.label_accuracy !== undefined &&
            (low === null || row.label_accuracy < low.label_accuracy)) low = row;
      });
      var about = "the gold lines plus k other lines, over the " + sweep.n_claims + " claims with a sweep (" +
        sweep.n_skipped + " left out); round 0 on the same claims " + pct(sweep.round0_label_accuracy) +
        "; per claim, accuracy over its k " + pct(sweep.sweep_accuracy) + ", NOT_ENOUGH_INFO share " +
        pct(sweep.sweep_nei_share);
      cells.push(low === null ? na("no claim has a size-sweep pool", "sweep-min") :
        el("td", {cls: "sweep-min", title: about}, [countLink(st, {run: k, r: 0, pool: "k" + low.k, ans: "correct"},
          pct(sweep.min_accuracy), "gold label on the size sweep's pool k = " + low.k + ", its lowest accuracy (" +
          low.n_claims + " claims; " + about + ")")]));
      var parts = [];
      rows.forEach(function (row, j) {
        if (j) parts.push(" / ");
        parts.push(countLink(st, {run: k, r: 0, pool: "k" + row.k, ans: "correct"}, pct(row.label_accuracy),
          "gold label on the size sweep's pool k = " + row.k + " (" + row.n_claims + " claims with one)"));
      });
      cells.push(el("td", {cls: "sweep-acc", title: about}, parts.length ? parts : ["n/a"]));
    }
    return cells;
  }

  // ---------------------------------------------------------------- list view
  function option(value, text, selected) {
    var o = el("option", {value: value, text: text});
    if (selected) o.selected = true;
    return o;
  }
  function controls(st) {
    var set = function (over) { return function (ev) {
      var o = {page: 0}; for (var k in over) o[k] = over[k](ev.target); go(listHash(st, o));
    }; };
    var runSel = el("select", {id: "f-run"}, IX.runs.map(function (run, k) { return option(k, run.name, k === st.run); }));
    runSel.onchange = set({run: function (t) { return +t.value; }});
    var rounds = []; for (var r = 0; r <= IX.rounds; r++) rounds.push(option(r, "round " + r, r === st.r));
    var rSel = el("select", {id: "f-round"}, rounds);
    rSel.onchange = set({r: function (t) { return +t.value; }});
    var aSel = el("select", {id: "f-answer"}, ANSWERS.filter(function (a) { return !st.pool || POOL_ANSWERS[a[0]]; })
      .map(function (a) {
        var text = st.pool && typeof POOL_ANSWERS[a[0]] === "string" ? POOL_ANSWERS[a[0]] : a[1];
        return option(a[0], text, a[0] === st.ans);
      }));
    aSel.onchange = set({ans: function (t) { return t.value; }});
    // where the answer filter reads: the ablation's round r, or one arm's pool (when some run asked it)
    var pools = [option("", "round r (the ablation)", st.pool === "")];
    if (hasArm("gold_only")) pools.push(option("gold", "the gold-only pool", st.pool === "gold"));
    if (hasArm("cited_only")) pools.push(option("cited", "the cited-only pool", st.pool === "cited"));
    for (var kk = 0; kk < sweepWidth(); kk++) pools.push(option("k" + kk, "size sweep k = " + kk, st.pool === "k" + kk));
    if (st.pool && !pools.some(function (o) { return o.selected; })) pools.push(option(st.pool, poolName(st.pool), true));
    var pSel = pools.length > 1 ? el("select", {id: "f-pool"}, pools) : null;
    if (pSel) pSel.onchange = set({pool: function (t) { return t.value; },
                                   ans: function (t) { return t.value && !POOL_ANSWERS[st.ans] ? "any" : st.ans; }});
    var sSel = el("select", {id: "f-set"}, [option("evaluated", "evaluated claims", st.set === "evaluated"),
      option("excluded", "NEI-gold (excluded)", st.set === "excluded"), option("all", "all", st.set === "all")]);
    sSel.onchange = set({set: function (t) { return t.value; }});
    var dSel = el("select", {id: "f-dataset"}, [option("", "all datasets", st.ds === "")].concat(
      IX.datasets.map(function (d, k) { return option(k, d || "(none)", String(k) === st.ds); })));
    dSel.onchange = set({ds: function (t) { return t.value; }});
    var gSel = el("select", {id: "f-gold"}, [option("", "any gold label", st.gold === "")].concat(
      IX.labels.map(function (l, k) { return option(k, l, String(k) === st.gold); })));
    gSel.onchange = set({gold: function (t) { return t.value; }});
    var oSel = el("select", {id: "f-sort"}, [option("order", "claim-set order", st.sort === "order"),
      option("drop", "largest P(gold) drop, round 0 \u2192 r", st.sort === "drop"),
      option("rise", "largest P(gold) rise, round 0 \u2192 r", st.sort === "rise")]);
    oSel.onchange = set({sort: function (t) { return t.value; }});
    var q = el("input", {id: "f-q", type: "search", placeholder: "search claims and ids", value: st.q});
    q.onchange = set({q: function (t) { return t.value; }});
    var flags = FLAGS.filter(function (f) {
      return (f[0] !== "disagree" || IX.runs.length > 1) && (!ARM_FLAGS[f[0]] || hasArm(ARM_FLAGS[f[0]]));
    }).map(function (f) {
      var box = el("input", {type: "checkbox", id: "f-flag-" + f[0]});
      box.checked = st.flags.indexOf(f[0]) >= 0;
      box.onchange = function () {
        var fl = st.flags.filter(function (x) { return x !== f[0]; });
        if (box.checked) fl.push(f[0]);
        go(listHash(st, {flags: fl, page: 0}));
      };
      return el("label", {}, [box, " " + f[1]]);
    });
    return el("div", {cls: "controls"}, [
      el("div", {}, [el("label", {}, ["filter on ", runSel]), el("label", {}, [" at ", rSel]),
                     el("label", {}, [" answer: ", aSel]),
                     pSel ? el("label", {}, [" on ", pSel]) : null, el("label", {}, [" claims: ", sSel]),
                     " ", dSel, " ", gSel]),
      el("div", {cls: "flags"}, flags),
      el("div", {}, [q, " ", el("label", {}, ["sort: ", oSel])])
    ]);
  }
  function chips(k, i, st) {
    var A = IX.answers[k], codes = A.labels[i], out = [];
    if (!codes) return el("span", {cls: "absent", text: "\u2014"});
    for (var r = 0; r < codes.length; r++) {
      var c = codes.charAt(r), ok = bit(A.correct[i], r);
      out.push(el("span", {cls: "chip c-" + (c === "?" ? "other" : c) + (ok ? " ok" : "") + (r === st.r ? " at" : ""),
                           title: "round " + r + ": " + CODE_NAME[c] + (ok ? " (gold)" : ""), text: c}));
    }
    var ctrl = (A.ctrl || [])[i] || "", gold = (A.gold_only || [])[i] || "";
    var cited = (A.cited_only || [])[i] || "", sweep = (A.sweep || [])[i] || "";
    var gl = GOLD_CODE[IX.labels[IX.claims.gold[i]]];
    var armChip = function (kind, c, what, pool) {
      var hit = c === gl;
      return el("span", {cls: "chip " + kind + " c-" + (c === "?" ? "other" : c === "-" ? "left" : c) + (hit ? " ok" : "") +
                         (pool && pool === st.pool ? " at" : ""),
                         title: what + ": " + CODE_NAME[c] + (hit ? " (gold)" : ""), text: c});
    };
    if (ctrl || gold || cited) {
      var arms = [], parts = [];
      if (ctrl) parts.push("control rounds 1\u2026R");
      if (gold) parts.push("gold-only");
      if (cited) parts.push("cited-only");
      for (var q = 1; q < ctrl.length; q++) arms.push(armChip("ctrl", ctrl.charAt(q), "control at round " + q));
      if (gold) arms.push(armChip("gold-only", gold, "gold-only", "gold"));
      if (cited) arms.push(armChip("cited-only", cited, "cited-only", "cited"));
      out.push(el("span", {cls: "arms", title: parts.join(", then ")}, arms));
    }
    if (sweep) {
      var sw = sweep === "-" ? [armChip("sweep", "-", "size sweep")] : sweep.split("").map(function (c, j) {
        return armChip("sweep", c, "size sweep k = " + j, "k" + j);
      });
      out.push(el("span", {cls: "arms sweep-chips", title: "size sweep, k = 0, 1, \u2026 other lines beside the gold"}, sw));
    }
    var d = drop(A, i, st.r);
    if (d !== null) out.push(el("span", {cls: "drop", title: "P(gold) round 0 \u2212 round " + st.r,
                                         text: (d >= 0.005 ? "\u2212" : d <= -0.005 ? "+" : "\u00b1") + Math.abs(d).toFixed(2)}));
    return el("span", {cls: "chips"}, out);
  }
  function renderList(st) {
    var t0 = performance.now();
    var sel = select(st), C = IX.claims;
    var pages = Math.max(1, Math.ceil(sel.length / PAGE)), page = Math.min(st.page, pages - 1);
    var rows = sel.slice(page * PAGE, page * PAGE + PAGE).map(function (i) {
      var cells = [
        el("td", {}, [el("a", {href: listHash(st, {claim: C.id[i]}), cls: "cid", text: C.id[i]})]),
        el("td", {cls: "gold", text: IX.labels[C.gold[i]]}),
        el("td", {cls: "text", title: C.text[i], text: C.text[i]})];
      IX.runs.forEach(function (_, k) { cells.push(el("td", {}, [chips(k, i, st)])); });
      return el("tr", {"data-claim": C.id[i]}, cells);
    });
    var pager = el("div", {cls: "pager"}, [
      page > 0 ? el("a", {href: listHash(st, {page: page - 1}), id: "prev-page", text: "\u2190 previous"}) : null,
      el("span", {id: "count", "data-count": sel.length,
                  text: " " + sel.length + " claims \u00b7 page " + (page + 1) + " of " + pages + " "}),
      page < pages - 1 ? el("a", {href: listHash(st, {page: page + 1}), id: "next-page", text: "next \u2192"}) : null]);
    var head = ["claim", "gold", "text"].concat(IX.runs.map(function (run) { return run.name + " (r = 0\u2026R)"; }));
    var app = document.getElementById("app");
    app.replaceChildren(
      el("section", {}, [el("h2", {text: "Runs"}), el("p", {cls: "note", text:
        "Metrics of each run (\u00d7100, metrics.json). A number is a link to the claims behind it."}), runTable(st)]),
      el("section", {}, [el("h2", {text: "Claims"}), controls(st), pager,
        el("table", {cls: "claims"}, [el("thead", {}, [el("tr", {}, head.map(function (h) {
          return el("th", {text: h}); }))]), el("tbody", {}, rows)])]));
    document.getElementById("where").textContent = "";
    timing.lastFilterMs = performance.now() - t0;
    timing.lastCount = sel.length;
  }

  // ---------------------------------------------------------------- claim page
  function loadShard(k, done) {
    if (shards[k]) return done(shards[k]);
    if (waiting[k]) return waiting[k].push(done);
    waiting[k] = [done];
    var s = document.createElement("script");
    s.src = "data/claims/" + String(k).padStart(5, "0") + ".js";
    s.onerror = function () {
      var cbs = waiting[k]; delete waiting[k];
      cbs.forEach(function (cb) { cb(null); });
    };
    document.head.appendChild(s);
  }
  function idsText(xs) { return xs && xs.length ? "[" + xs.join(", ") + "]" : "none"; }
  function chart(rounds, gold, R) {
    var W = 250, H = 124, L = 30, T = 22, B = 28, Rr = 10, w = W - L - Rr, h = H - T - B;
    var x = function (r) { return L + (R ? w * r / R : w / 2); }, y = function (p) { return T + h * (1 - p); };
    var g = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, cls: "chart", role: "img"});
    g.setAttribute("class", "chart");
    g.appendChild(svg("rect", {x: L, y: T, width: w, height: h, fill: "none", stroke: "#bbb"}));
    [0, 0.5, 1].forEach(function (p) {
      g.appendChild(svg("text", {x: L - 4, y: y(p) + 3, "text-anchor": "end", "font-size": 9}, p.toFixed(1)));
      if (p === 0.5) g.appendChild(svg("line", {x1: L, x2: L + w, y1: y(p), y2: y(p), stroke: "#eee"}));
    });
    for (var r = 0; r <= R; r++) g.appendChild(svg("text", {x: x(r), y: H - 6, "text-anchor": "middle",
                                                              "font-size": 10}, String(r)));
    var series = [["P(gold)", "#1f77b4", "", function (p) { return p[gold]; }, "circle"],
                  ["P(NEI)", "#d62728", "4 3", function (p) { return p.NOT_ENOUGH_INFO; }, "square"]];
    series.forEach(function (s, k) {
      var pts = [];
      rounds.forEach(function (rd, r) {
        var p = rd.label_probs;
        if (p && typeof p === "object") pts.push([x(r), y(+(s[3](p) || 0))]);
      });
      if (pts.length) g.appendChild(svg("polyline", {points: pts.map(function (q) { return q.join(","); }).join(" "),
        fill: "none", stroke: s[1], "stroke-width": 1.6, "stroke-dasharray": s[2]}));
      pts.forEach(function (q) {
        g.appendChild(s[4] === "circle" ? svg("circle", {cx: q[0], cy: q[1], r: 3, fill: s[1]})
          : svg("rect", {x: q[0] - 3, y: q[1] - 3, width: 6, height: 6, fill: "white", stroke: s[1]}));
      });
      var lx = L + k * 80;
      g.appendChild(svg("line", {x1: lx, x2: lx + 16, y1: 9, y2: 9, stroke: s[1], "stroke-width": 1.6,
                                 "stroke-dasharray": s[2]}));
      g.appendChild(svg("text", {x: lx + 20, y: 13, "font-size": 10}, s[0]));
      if (!pts.length && k === 0) g.appendChild(svg("text", {x: L + w / 2, y: T + h / 2, "text-anchor": "middle",
                                                             "font-size": 10}, "no label probabilities"));
    });
    return g;
  }
  function poolList(d, rd, gone) {
    var inPool = {}, cited = {}, gold = {};
    (rd.pool_ids || []).forEach(function (i) { inPool[i] = true; });
    (rd.cited || []).forEach(function (i) { cited[i] = true; });
    (d.gold_groups || []).forEach(function (g) { g.forEach(function (i) { gold[i] = true; }); });
    var sentences = d.sentences || (rd.pool_ids || []).map(function (i) { return [i, null, null]; });
    return el("ol", {cls: "pool"}, sentences.map(function (s) {
      var sid = s[0], text = s[1] === null ? "(text not in the records file)" : s[1];
      var removed = !inPool[sid], cls = removed ? "removed" : (cited[sid] ? "cited" : "kept");
      var body = removed ? el("s", {text: text}) : cited[sid] ? el("mark", {text: text}) : el("span", {text: text});
      return el("li", {"data-sid": sid, cls: cls + (gold[sid] ? " gold" : ""),
                       title: (gold[sid] ? "gold evidence; " : "") + (removed ? (gone || "removed (cited in an earlier round)")
                              : cited[sid] ? "cited at this round" : "in the pool")},
                [el("span", {cls: "sid", text: (gold[sid] ? "\u2605" : "") + sid}), body,
                 s[2] ? el("span", {cls: "doc", text: " (" + s[2] + ")"}) : null]);
    }));
  }
  function roundCell(d, rounds, k, r) {
    var rd = rounds[r];
    if (!rd) return el("div", {cls: "round none", "data-run": k, "data-round": r, text: "no round " + r});
    var valid = rd.valid !== undefined ? rd.valid : rd.label !== null && rd.label !== undefined;
    var label = valid && rd.label !== null && rd.label !== undefined ? rd.label : "invalid";
    var ok = valid && (rd.label === d.gold_label);
    var p = rd.label_probs && typeof rd.label_probs === "object" ? rd.label_probs : null;
    var tags = [rd.reused ? "reused" : null, rd.truncated ? "cut off" : null].filter(Boolean);
    return el("div", {cls: "round", "data-run": k, "data-round": r}, [
      el("h4", {}, ["round " + r + " \u00b7 ", el("span", {cls: "parsed-label l-" + label + (ok ? " ok" : ""), text: label}),
                    tags.length ? " \u00b7 " + tags.join(", ") : ""]),
      poolList(d, rd),
      el("pre", {cls: "raw", title: "raw answer", text: rd.raw_output === null || rd.raw_output === undefined
                                                        ? "" : String(rd.raw_output)}),
      el("dl", {}, [
        el("dt", {text: "parsed label"}), el("dd", {cls: "label-value", text: label}),
        el("dt", {text: "cited"}), el("dd", {cls: "cited-ids", text: idsText(rd.cited)}),
        el("dt", {text: "hallucinated"}), el("dd", {cls: "hallucinated-ids", text: idsText(rd.hallucinated)}),
        el("dt", {text: "evidence (order)"}), el("dd", {text: idsText(rd.evidence)}),
        p ? el("dt", {text: "P(gold) / P(NEI)"}) : null,
        p ? el("dd", {text: (+(p[d.gold_label] || 0)).toFixed(3) + " / " + (+(p.NOT_ENOUGH_INFO || 0)).toFixed(3)}) : null,
        rd.error ? el("dt", {text: "error"}) : null, rd.error ? el("dd", {cls: "error", text: rd.error}) : null])
    ]);
  }
  /* Where the lines of `full` missing from `pool` lie in reading order (fae.ablation.engine.removal_gap). */
  function removalGap(full, pool) {
    var keep = {}, kept = [];
    (pool || []).forEach(function (i) { keep[i] = true; });
    full.forEach(function (i, k) { if (keep[i]) kept.push(k); });
    if (kept.length === full.length) return [];
    if (!kept.length) return ["leading", "interior", "trailing"];
    var lo = kept[0], hi = kept[kept.length - 1], kinds = [];
    if (lo > 0) kinds.push("leading");
    if (hi - lo + 1 > kept.length) kinds.push("interior");
    if (hi < full.length - 1) kinds.push("trailing");
    return kinds;
  }
  var GAP_MATCH = {kind: "yes: the same kind of gap as the ablation",
                   shown: "yes: a gap the prompt shows exactly when the ablation's shows"};
  /* Whether the control of round r was matched on the gap the ablation left (its gap_matched), and both gaps. */
  function gapNote(d, k, r, rd) {
    var rounds = (d.runs || [])[k] || [], full = (rounds[0] || {}).pool_ids, abl = (rounds[r] || {}).pool_ids;
    var gaps = full && abl ? " (control: " + (removalGap(full, rd.pool_ids).join(", ") || "no gap") + "; ablation: " +
      (removalGap(full, abl).join(", ") || "no gap") + ")" : "";
    if (!("gap_matched" in rd)) return "not matched (a random control, or a run made before matching)" + gaps;
    var how = rd.gap_matched;
    return (how === null ? "no: no draw could leave the ablation's gap" : GAP_MATCH[how] || String(how)) + gaps;
  }
  function answerLabel(rd, gold) {
    var valid = rd.valid !== undefined ? rd.valid : rd.label !== null && rd.label !== undefined;
    var label = valid && rd.label !== null && rd.label !== undefined ? rd.label : "invalid";
    return {label: label, ok: valid && rd.label === gold};
  }
  function armNote(attrs, text) { return el("div", attrs, [el("h4", {text: text})]); }
  function armLeftOut(attrs, name, reason) {
    attrs.cls += " left-out";
    return el("div", attrs, [el("h4", {}, [name + " \u00b7 ", el("span", {cls: "arm-label", text: "left out"})]),
                             el("p", {cls: "left-out-reason", text: "left out: " + reason})]);
  }
  /* One answered arm pool: its label, the pool (lines not in it struck: `gone` on hover), the raw answer and ids. */
  function armAnswer(d, attrs, title, name, rd, gone, extra) {
    var lab = answerLabel(rd, d.gold_label);
    var tags = [rd.reused ? "reused" : null, rd.truncated ? "cut off" : null].filter(Boolean);
    return el("div", attrs, [
      el("h4", {}, [title + " \u00b7 ",
                    el("span", {cls: "arm-label parsed-label l-" + lab.label + (lab.ok ? " ok" : ""), text: lab.label}),
                    tags.length ? " \u00b7 " : "", tags.length ? el("span", {cls: "arm-tags", text: tags.join(", ")}) : null]),
      poolList(d, rd, gone),
      el("pre", {cls: "raw", title: name + " raw answer", text: rd.raw_output === null || rd.raw_output === undefined
                                                              ? "" : String(rd.raw_output)}),
      el("dl", {}, (extra || []).concat([
        el("dt", {text: "parsed label"}), el("dd", {cls: "label-value", text: lab.label}),
        el("dt", {text: "cited"}), el("dd", {cls: "cited-ids", text: idsText(rd.cited)}),
        el("dt", {text: "hallucinated"}), el("dd", {text: idsText(rd.hallucinated)}),
        rd.error ? el("dt", {text: "error"}) : null, rd.error ? el("dd", {cls: "error", text: rd.error}) : null]))
    ]);
  }
  /* The control pool of round r (r >= 1) or the gold-only pool (r = 0) of run k, beside its round r. */
  function armCell(d, k, r) {
    var attrs = {cls: "arm " + (r ? "control" : "gold-only"), "data-run": k, "data-arm-round": r};
    var name = r ? "control" : "gold-only";
    var rd = r ? ((d.control || [])[k] || [])[r - 1] : (d.gold_only || [])[k];
    if (rd === null || rd === undefined) return armNote(attrs, name + ": not asked");
    if (rd.skipped !== undefined) return armLeftOut(attrs, name, rd.skipped);
    if (r && rd.gap_matched === null) attrs.cls += " gap-unmatched";
    return armAnswer(d, attrs, name + (r ? " " + r : ""), name, rd,
      r ? "removed by the control (neither cited before nor gold)" : "not gold: not in the gold-only pool",
      r ? [el("dt", {text: "control removed"}), el("dd", {cls: "ctrl-removed", text: idsText(rd.removed || [])}),
           el("dt", {text: "gap matched"}), el("dd", {cls: "gap-matched", text: gapNote(d, k, r, rd)})] : []);
  }
  /* The sufficiency panels of run k below its rounds: the cited-only pool, then each size-sweep pool k. */
  function sufficiencyCells(d, k) {
    var run = IX.runs[k], out = [], arms = run.arms || {};
    if (arms.cited_only) {
      var attrs = {cls: "arm cited-only", "data-run": k, "data-arm": "cited-only"}, rd = (d.cited_only || [])[k];
      if (rd === null || rd === undefined) out.push(armNote(attrs, "cited-only: not asked"));
      else if (rd.skipped !== undefined) out.push(armLeftOut(attrs, "cited-only", rd.skipped));
      else out.push(armAnswer(d, attrs, "cited-only", "cited-only", rd,
        "not cited at round 0: not in the cited-only pool",
        [el("dt", {text: "round 0 cited"}), el("dd", {text: idsText(((d.runs[k] || [])[0] || {}).cited)})]));
    }
    if (arms.size_sweep) {
      var sw = (d.size_sweep || [])[k], base = {cls: "arm sweep", "data-run": k, "data-arm": "sweep"};
      if (sw === null || sw === undefined) out.push(armNote(base, "size sweep: not asked"));
      else if (sw.skipped !== undefined) out.push(armLeftOut(base, "size sweep", sw.skipped));
      else (sw.rounds || []).forEach(function (rd, j) {
        var kk = rd && rd.k !== undefined ? rd.k : j, attrs = {cls: base.cls, "data-run": k, "data-arm": "sweep", "data-k": kk};
        if (!rd) return out.push(armNote(attrs, "size sweep k = " + kk + ": not answered"));
        var added = (sw.order || []).slice(0, kk);
        out.push(armAnswer(d, attrs, "size sweep k = " + kk, "size sweep", rd,
          "not in the pool at k = " + kk + " (neither gold nor among the first " + kk + " lines of the sweep's order)",
          [el("dt", {text: "added"}), el("dd", {cls: "sweep-added", text: idsText(added)}),
           el("dt", {text: "pool size"}), el("dd", {text: String((rd.pool_ids || []).length)})]));
      });
    }
    return out;
  }
  function renderClaim(st) {
    var i = IX.claims.id.indexOf(st.claim);
    var app = document.getElementById("app");
    if (i < 0) {
      app.replaceChildren(el("p", {cls: "error", text: "No claim with id " + st.claim + " in this viewer."}),
                          el("a", {href: listHash(st, {claim: null}), text: "\u2190 claims"}));
      return done();
    }
    var sel = select(st), at = sel.indexOf(i);
    var nav = el("nav", {}, [el("a", {href: listHash(st, {claim: null}), id: "back", text: "\u2190 claims"}),
      at > 0 ? el("a", {href: listHash(st, {claim: IX.claims.id[sel[at - 1]]}), id: "prev", text: " \u2190 previous"}) : null,
      at >= 0 && at < sel.length - 1 ? el("a", {href: listHash(st, {claim: IX.claims.id[sel[at + 1]]}), id: "next",
                                                 text: " next \u2192"}) : null,
      el("span", {text: at >= 0 ? "  (" + (at + 1) + " of " + sel.length + " selected)" : "  (not in the selection)"})]);
    app.replaceChildren(nav, el("p", {text: "Loading claim\u2026"}));
    document.body.dataset.state = "loading";
    var k = Math.floor(i / IX.shard_size);
    loadShard(k, function (shard) {
      if (parseHash().claim !== st.claim) return;   // the user moved on meanwhile
      if (!shard) {
        app.replaceChildren(nav, el("p", {cls: "error", text: "Cannot load data/claims/" + k + ": is the viewer complete?"}));
        return done();
      }
      var d = shard[i - k * IX.shard_size], R = IX.rounds;
      var groups = (d.gold_groups || []).map(function (g) { return "{" + g.join(", ") + "}"; }).join(" or ");
      var head = el("section", {cls: "claim-head"}, [
        el("h2", {}, ["Claim ", el("code", {id: "claim-id", text: d.id})]),
        el("blockquote", {id: "claim-text", text: d.claim === null ? "(claim not in the records file)" : d.claim}),
        el("p", {}, ["gold label ", el("b", {id: "gold-label", text: d.gold_label}), " \u00b7 gold groups ",
                     el("span", {id: "gold-groups", text: groups || "none"}),
                     d.dataset ? " \u00b7 dataset " + d.dataset : "",
                     IX.claims.excluded[i] ? el("span", {cls: "warn", text:
                       " \u00b7 gold NOT_ENOUGH_INFO: not evaluated (SPEC \u00a71)"}) : null]),
        el("p", {cls: "legend"}, [el("s", {text: "struck"}), " removed (cited in an earlier round) \u00b7 ",
                                  el("mark", {text: "highlighted"}), " cited at this round \u00b7 \u2605 gold evidence"])]);
      // one column per run, and beside it a column for its control and gold-only answers when it asked them
      var arms = IX.runs.map(function (run) { return !!(run.arms && (run.arms.control || run.arms.gold_only)); });
      var cols = arms.map(function (a) { return a ? "minmax(330px, 1fr) minmax(280px, 1fr)" : "minmax(330px, 1fr)"; });
      var grid = el("div", {cls: "grid", style: "grid-template-columns: " + cols.join(" ")});
      d.runs.forEach(function (rounds, k2) {
        grid.appendChild(el("div", {cls: "run-head", "data-run": k2, style: arms[k2] ? "grid-column: span 2" : null},
          [el("h3", {text: IX.runs[k2].name}),
           rounds ? chips(k2, i, st) : el("p", {cls: "note", text: "not in this run"}),
           rounds ? chart(rounds, d.gold_label, R) : null,
           arms[k2] && rounds ? el("p", {cls: "note", text: "right: the control pool of each round r \u2265 1 " +
             "(as many lines removed as the ablation removed, none cited or gold) and, beside round 0, the gold " +
             "sentences alone"}) : null]));
      });
      for (var r = 0; r <= R; r++) d.runs.forEach(function (rounds, k2) {
        grid.appendChild(rounds ? roundCell(d, rounds, k2, r) : el("div", {cls: "round none"}));
        if (arms[k2]) grid.appendChild(rounds ? armCell(d, k2, r) : el("div", {cls: "arm none"}));
      });
      // below the rounds, the sufficiency pools of each run, filling its columns left to right
      var suff = d.runs.map(function (rounds, k2) { return rounds ? sufficiencyCells(d, k2) : []; });
      var width = arms.map(function (a) { return a ? 2 : 1; });
      var rows = Math.max.apply(null, [0].concat(suff.map(function (c, k2) { return Math.ceil(c.length / width[k2]); })));
      if (rows) grid.appendChild(el("h3", {cls: "suff-head", style: "grid-column: 1 / -1", text:
        "Sufficiency: the lines round 0 cited, alone (cited-only), and the size sweep (the gold lines plus k other " +
        "lines, added in a seeded order); lines not in a pool are struck through"}));
      for (var j = 0; j < rows; j++) suff.forEach(function (cells, k2) {
        for (var c = 0; c < width[k2]; c++) grid.appendChild(cells[j * width[k2] + c] || el("div", {cls: "arm none"}));
      });
      app.replaceChildren(nav, head, grid);
      document.getElementById("where").textContent = " \u203a " + d.id;
      done();
    });
  }

  // ---------------------------------------------------------------- routing
  function done() {
    document.body.dataset.state = "ready";
    document.body.dataset.route = location.hash;
  }
  function route() {
    var st = parseHash();
    document.body.dataset.state = "rendering";
    if (st.claim !== null) renderClaim(st);
    else { renderList(st); done(); }
  }
  window.FAE_VIEW = {
    timing: timing,
    index: function (ix) {
      timing.indexLoaded = performance.now();
      IX = ix;
      document.title = ix.title;
      window.addEventListener("hashchange", route);
      route();
      timing.firstRender = performance.now();
    },
    shard: function (k, data) {
      shards[k] = data;
      var cbs = waiting[k] || []; delete waiting[k];
      cbs.forEach(function (cb) { cb(data); });
    },
    select: function (hash) {   // for tests: the claim ids a list hash selects
      var saved = location.hash; history.replaceState(null, "", hash);
      var st = parseHash(); history.replaceState(null, "", saved || "#");
      return select(st).map(function (i) { return IX.claims.id[i]; });
    }
  };
})();
