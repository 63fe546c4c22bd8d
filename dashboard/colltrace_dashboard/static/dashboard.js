// colltrace dashboard: polls api/view and rebuilds the page's sections with the same markup as
// templates/index.html. Every string from the job (function names, file paths, ops) goes in
// through textContent or an attribute value, never through innerHTML.
"use strict";

(function () {
  const pollMs = Number(document.body.dataset.pollMs) || 1000;

  // h("tr", {className: "x", title: "t"}, "text", child, ...): an element; strings become text nodes.
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "className" || k === "title" || k === "hidden") el[k] = v;
      else el.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  const $ = (id) => document.getElementById(id);
  const dash = (v) => (v === null || v === undefined || v === "" ? "–" : String(v));
  const clock = (t) => (t ? new Date(t * 1000).toTimeString().slice(0, 8) : "?");
  const under = (s) => String(s).replace(/_/g, " ");
  const num = (n) => (n === null || n === undefined ? "–" : n === 0 ? "none" : "#" + n);

  function secs(span) {
    if (!span) return "–";
    const [a, b] = span;
    return a.toFixed(1) + (b - a >= 0.05 ? "–" + b.toFixed(1) : "") + " s";
  }

  function finding(f) {
    let meta = "";
    if (f.group !== null && f.group !== undefined) meta += "group " + f.group;
    if (f.seq !== null && f.seq !== undefined) meta += " #" + f.seq;
    if (f.detected_at) meta += " · detected " + clock(f.detected_at);
    const art = h("article", {className: "finding kind-" + f.kind},
      h("h3", {}, h("span", {className: "kind"}, f.kind), " ", h("span", {className: "meta"}, meta)),
      h("p", {className: "paragraph"}, f.paragraph));
    if (f.stacks && f.stacks.length) {
      const body = h("tbody", {}, f.stacks.map((s) => h("tr", {}, h("th", {}, s.ranks), h("td", {}, s.stack))));
      if (f.more_stacks) body.append(h("tr", {}, h("td", {colspan: 2}, "… " + f.more_stacks)));
      art.append(h("table", {className: "stacks"}, h("caption", {}, "stacks (ranks with the same stack)"), body));
    }
    for (const n of f.native || []) {
      art.append(h("table", {className: "stacks native"}, h("caption", {}, n.caption),
        h("tbody", {}, n.frames.map((line) => h("tr", {}, h("td", {}, line))))));
    }
    return art;
  }

  function renderVerdict(v) {
    const head = $("headline");
    head.textContent = v.verdict.headline;
    head.className = v.verdict.problems ? "bad" : "good";
    $("findings").replaceChildren(...v.findings.map(finding));
    const earlier = $("earlier");
    earlier.hidden = !v.earlier.length;
    earlier.querySelector("summary").textContent =
      v.earlier.length + " reported earlier by the watchdog, no longer current";
    $("earlier-list").replaceChildren(...v.earlier.map(finding));
  }

  function renderRanks(r) {
    $("rank-summary").textContent = r.summary;
    $("rank-rows").replaceChildren(...r.classes.map((c) => h("tr", {className: "status-" + c.status + " state-" + c.state},
      h("th", {}, c.ranks), h("td", {}, c.count), h("td", {}, c.ending || c.status), h("td", {}, under(c.state)),
      h("td", {}, dash(c.op) + (c.peer !== null && c.peer !== undefined ? " ↔ rank " + c.peer : "")),
      h("td", {}, dash(c.group)), h("td", {}, dash(c.seq)), h("td", {}, secs(c.waiting_s)),
      h("td", {}, secs(c.heartbeat_age_s)), h("td", {className: "where"}, dash(c.where)))));
    const more = $("rank-more");
    more.hidden = !r.more;
    more.textContent = r.more ? "… " + r.more.classes + " more classes (" + r.more.ranks + " ranks)" : "";
  }

  function renderGroups(g) {
    const table = document.querySelector("table.groups");
    table.querySelectorAll("tbody").forEach((b) => b.remove());
    for (const row of g.rows) {
      const title = "group " + row.name + (row.desc ? " (" + row.desc + ")" : "") + " · " + row.size + " ranks " +
        row.ranks + " · furthest: entered " + num(row.entered) + ", completed " + num(row.completed);
      const body = h("tbody", {className: "group" + (row.in_step ? "" : " out-of-step")},
        h("tr", {className: "group-head"}, h("th", {colspan: 5}, title)));
      for (const m of row.members) {
        body.append(h("tr", {className: "member" + (m.behind ? " laggard" : "")}, h("td", {}), h("td", {}, m.ranks),
          h("td", {}, num(m.entered)), h("td", {}, num(m.completed)),
          h("td", {}, m.says)));
      }
      table.append(body);
    }
    const more = $("group-more");
    more.hidden = !g.hidden;
    more.textContent = g.hidden ? "… " + g.hidden.groups + " more groups, " + g.hidden.in_step + " of them in step" : "";
  }

  function event(e) {
    let title = e.op + (e.group !== null && e.group !== undefined ? " on group " + e.group : "") + " #" + e.seq + " · " + e.state;
    if (e.duration_s !== null) title += " · " + (e.duration_s * 1000).toFixed(2) + " ms";
    if (e.waiting_s !== null) title += " · waiting " + e.waiting_s.toFixed(1) + " s";
    if (e.where) title += " · " + e.where;
    return h("li", {className: "ev st-" + e.state, title: title}, h("span", {className: "ev-op"}, e.op),
      h("span", {className: "ev-num"}, e.p2p ? "peer " + e.peer : "g" + e.group + " #" + e.seq));
  }

  function renderTimeline(t) {
    $("timeline-rows").replaceChildren(...t.rows.map((row) => h("div", {className: "tl-row"},
      h("div", {className: "tl-ranks"}, row.ranks), h("ol", {className: "tl-events"}, row.events.map(event)))));
    const more = $("timeline-more");
    more.hidden = !t.more;
    more.textContent = t.more ? "… " + t.more.rows + " more rows (" + t.more.ranks + " ranks)" : "";
  }

  function renderStragglers(st) {
    $("straggler-rows").replaceChildren(...st.rows.map((s) => h("tr", {}, h("th", {}, s.rank),
      h("td", {}, s.collectives + " of " + s.of), h("td", {}, s.lag_ms + " ms"), h("td", {}, s.waited_s + " s"),
      h("td", {}, s.share + " %"), h("td", {className: "where"}, dash(s.where)))));
    $("straggler-none").hidden = st.rows.length > 0;
    $("lag-rows").replaceChildren(...st.lags.map((row) => h("div", {className: "lag-row"},
      h("div", {className: "lag-rank"}, "rank " + row.rank),
      h("div", {className: "lag-cells"}, row.cells.map((c) => h("span", {className: "lag b" + c[1], title: c[0] + " ms"}))))));
  }

  function banner(text) {
    const b = $("banner");
    b.hidden = !text;
    b.textContent = text || "";
  }

  function render(v) {
    const mode = $("mode");
    mode.textContent = v.mode;
    mode.className = "badge mode-" + v.mode;
    $("updated").textContent = "state at " + clock(v.taken_at);
    banner(v.error || v.note);
    renderVerdict(v);
    renderRanks(v.ranks);
    renderGroups(v.groups);
    renderTimeline(v.timeline);
    renderStragglers(v.stragglers);
    document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
  }

  async function poll() {
    try {
      const resp = await fetch("api/view", {cache: "no-store", credentials: "same-origin",
                                            headers: {"Accept": "application/json"}});
      const body = await resp.json();
      if (resp.ok) render(body);
      else banner(body.error || "the dashboard answered " + resp.status);
    } catch (err) {
      banner("lost contact with the dashboard server; retrying");
    }
    setTimeout(poll, pollMs);
  }

  setTimeout(poll, pollMs);
})();
