/* killpoint's report pages: draws a run's timeline, event table and downstream ledger from the
   data its page embeds (script#killpoint-view, inert JSON; the lists' order is reports/render.py's
   view()). Every string from a run is set as text (textContent) or as an attribute's value
   (setAttribute), never parsed as markup; links and ids are built from numbers. It loads nothing. */
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";  /* the SVG namespace's name, not an address to load */
  var STATUS = ["ok", "fail", "info", "event"];
  var GLYPH = ["\u2713", "\u2717", "?", ""];
  var SPAN = 1, INDETERMINATE = 2, PROOF = 4;  /* a mark's flags */
  var ROW_PROOF = 1, ROW_DRAWN = 2;  /* an event row's flags */
  var ROW_H = 16, HEAD_H = 24;

  function html(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    for (var name in attrs) {
      if (Object.prototype.hasOwnProperty.call(attrs, name)) { node.setAttribute(name, String(attrs[name])); }
    }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function put(parent, child) { parent.appendChild(child); return child; }

  function status(code) { return STATUS[code] || "event"; }

  function empty(node) { while (node.firstChild) { node.removeChild(node.firstChild); } return node; }

  /* -- the timeline ----------------------------------------------------------------------------- */
  function legend() {
    var p = html("p", "legend");
    var keys = [["bg-ok", "\u2713 ok: took effect"], ["bg-fail", "\u2717 fail: certainly did not / refused / killed"],
                ["bg-info", "? info: outcome unknown, or a pause"],
                ["indet", "indeterminate: may take effect until the end of the run"], ["bg-event", "event"],
                ["proofkey", "named by a violation"], ["leasekey", "lease held"],
                ["leaseout", "lease not renewed, running out"], ["expirykey", "lease expired"]];
    keys.forEach(function (key) {
      var span = put(p, html("span"));
      put(span, html("i", key[0]));
      span.appendChild(document.createTextNode(key[1]));
    });
    return p;
  }

  function sized(node, t, y0, y1) {
    node.setAttribute("width", "100%");
    node.setAttribute("viewBox", "0 " + y0 + " " + t.w + " " + (y1 - y0));
    node.setAttribute("preserveAspectRatio", "xMinYMin meet");
    node.style.maxWidth = t.w + "px";
    return node;
  }

  function heads(t) {
    var head = sized(svg("svg", {"class": "tl-head", role: "presentation"}), t, 0, HEAD_H);
    t.lanes.forEach(function (lane) {
      var text = put(head, svg("text", {x: lane[0] + 6, y: 16}, lane[1]));
      put(text, svg("title", {}, lane[2]));
    });
    return head;
  }

  /* The drawing between heights y0 and y1 (the whole, or one side of the fold). */
  function draw(t, y0, y1) {
    var root = sized(svg("svg", {"class": "tl", role: "img", "aria-label": "swimlane timeline of the run"}), t, y0, y1);
    t.lanes.forEach(function (lane, n) {
      put(root, svg("rect", {"class": n % 2 ? "lane alt" : "lane", x: lane[0], y: y0, width: t.lw, height: y1 - y0}));
      var lifeY = lane[3], lifeH = lane[4];
      if (lifeY !== null && lifeY < y1 && lifeY + lifeH > y0) {
        put(root, svg("rect", {"class": lane[5] ? "life dead" : "life", x: lane[0] + 1, y: lifeY,
                               width: t.lw - 2, height: lifeH}));
      }
    });
    t.rows.forEach(function (row) {
      if (y0 <= row[0] && row[0] < y1) { put(root, svg("text", {"class": "t", x: 4, y: row[0] + 11}, row[1])); }
    });
    t.breaks.forEach(function (b) {
      if (y0 <= b[0] && b[0] < y1) {
        var g = put(root, svg("g", {"class": "brk"}));
        put(g, svg("line", {x1: 0, x2: t.w, y1: b[0], y2: b[0]}));
        put(g, svg("text", {x: 4, y: b[0] - 3}, "\u22ee " + b[1]));
      }
    });
    t.leases.forEach(function (l) {
      var index = l[0], x = l[1], y = l[2], held = l[3], out = l[4], expiry = l[5];
      if (!(y < y1 && y + held + out >= y0)) { return; }
      var a = put(root, svg("a", {"class": "lease", href: "#e" + index}));
      put(a, svg("title", {}, l[7]));
      put(a, svg("rect", {"class": "held", x: x, y: y, width: 5, height: held}));
      if (out) { put(a, svg("rect", {"class": "out", x: x, y: y + held, width: 5, height: out})); }
      if (expiry !== null && y0 <= expiry && expiry < y1) {
        put(a, svg("path", {"class": "expiry", d: "M" + (x - 2) + " " + expiry + "h" + (t.lw - 4)}));
        put(a, svg("text", {"class": "expiry", x: x + 8, y: expiry - 3}, "lease fence " + l[6] + " expired"));
      }
    });
    t.marks.forEach(function (m) {
      var index = m[0], x = m[1], y = m[2], h = m[3], code = m[4], flags = m[5];
      var span = flags & SPAN;
      if (!(y < y1 && (y >= y0 || (span && y + h > y0)))) { return; }
      var cls = "mk " + status(code) + (flags & INDETERMINATE ? " indet" : "") + (flags & PROOF ? " proof" : "");
      var attrs = {"class": cls, href: "#e" + index};
      if (y >= y0) { attrs.id = "t" + index; }
      var a = put(root, svg("a", attrs));
      if (m.length > 7) { put(a, svg("title", {}, m[7])); }
      if (span) {
        put(a, svg("rect", {x: x, y: y, width: 7, height: h, rx: 2}));
      } else {
        put(a, svg("circle", {cx: x + 3, cy: y + 7, r: 4}));
      }
      var text = put(a, svg("text", {x: x + 12, y: y + 11}));
      if (GLYPH[code]) {
        put(text, svg("tspan", {"class": "g"}, GLYPH[code]));
        text.appendChild(document.createTextNode(" "));
      }
      text.appendChild(document.createTextNode(m[6]));
    });
    return root;
  }

  function timeline(place, t) {
    empty(place);
    put(place, html("p", "note", "One lane per worker incarnation (A.2 is worker A after a restart), then the downstream, " +
      "the store and the harness. A quiet gap longer than " + t.gap_ms + " ms is drawn " + t.gap_px + " px tall, the axis " +
      "broken and labelled with the run time it stands for. Bars are operations from invoke to completion, and at a " +
      "lane's left edge the leases its worker held. Hover a mark for its whole label; click it for its row in the " +
      "event table."));
    put(place, legend());
    var scroll = put(place, html("div", "tl-scroll"));
    put(scroll, heads(t));
    if (t.cut) {
      var folded = 0;
      t.marks.forEach(function (m) { if (m[2] < t.cut) { folded += 1; } });
      var details = put(scroll, html("details", "earlier"));
      put(details, html("summary", null, folded + " earlier marks, from the start of the run (the drawing opens just above "
                                         + t.opens + ")"));
      put(details, draw(t, 0, t.cut));
    }
    put(scroll, draw(t, t.cut, t.h));
  }

  /* -- the tables ------------------------------------------------------------------------------- */
  function head(table, names, titles) {
    var row = put(put(table, html("thead")), html("tr"));
    names.forEach(function (name, n) {
      var th = put(row, html("th", null, name));
      if (titles && titles[n]) { th.title = titles[n]; }
    });
    return put(table, html("tbody"));
  }

  function cell(row, text, cls) { return put(row, html("td", cls, text)); }

  function events(place, words, rows) {
    empty(place);
    var table = put(place, html("table", "events"));
    var cols = put(table, html("colgroup"));
    ["c-n", "c-ms", "c-p", "c-k", "c-t", "c-i", "c-s", ""].forEach(function (c) { put(cols, html("col", c)); });
    var body = head(table, ["#", "ms", "process", "kind", "type", "instance", "step", "data"],
                    [null, "the run's time since its first event, in ms"]);
    rows.forEach(function (e) {
      var index = e[0], flags = e[9];
      var tr = put(body, html("tr", flags & ROW_PROOF ? "proof" : null));
      tr.id = "e" + index;
      var first = cell(tr);
      if (flags & ROW_DRAWN) {
        var a = put(first, html("a", null, index));
        a.href = "#t" + index;
        a.title = "show in the timeline";
      } else {
        first.textContent = String(index);
      }
      cell(tr, Number(e[1]).toFixed(3));
      cell(tr, words[e[2]]);
      cell(tr, words[e[3]]);
      cell(tr, words[e[4]], "st " + status(e[5]));
      cell(tr, words[e[6]]);
      cell(tr, words[e[7]]);
      put(cell(tr, null, "detail"), html("code", null, e[8]));
    });
  }

  function invariants(place, rows) {
    empty(place);
    var body = head(put(place, html("table")), ["invariant", "verdict", "checked", "violations", "detail"]);
    rows.forEach(function (r) {
      var tr = put(body, html("tr"));
      put(cell(tr), html("code", null, r[0]));
      cell(tr, r[1], "st " + r[1].replace(/ /g, "-"));
      cell(tr, r[2]);
      cell(tr, r[3]);
      cell(tr, r[4], "detail");
    });
  }

  function ledger(place, rows) {
    empty(place);
    if (!rows.length) { put(place, html("p", null, "No requests.")); return; }
    var table = put(place, html("table"));
    var body = head(table, ["seq", "key (or scope)", "resource", "intent hash", "fence", "worker", "attempt", "HTTP",
                            "outcome", "event"]);
    rows.forEach(function (r) {
      var tr = put(body, html("tr"));
      cell(tr, r[1]);
      put(cell(tr), html("code", null, r[2]));
      cell(tr, r[3], "name");
      put(cell(tr), html("code", null, r[4]));
      cell(tr, r[5]);
      cell(tr, r[6]);
      cell(tr, r[7]);
      cell(tr, r[8]);
      cell(tr, r[9] + (r[10] ? " (effect)" : ""), "st " + status(r[11]));
      var a = put(cell(tr), html("a", null, "e" + r[0]));
      a.href = "#e" + r[0];
    });
  }

  /* The view is gzip-compressed JSON in base64 (a third of its size as plain JSON). */
  function decode(block) {
    var text = atob(block.textContent.replace(/\s+/g, ""));
    var bytes = new Uint8Array(text.length);
    for (var n = 0; n < text.length; n += 1) { bytes[n] = text.charCodeAt(n); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text().then(JSON.parse);
  }

  function drawn(view) {
    timeline(document.getElementById("kp-timeline"), view.timeline);
    invariants(document.getElementById("kp-invariants"), view.invariants);
    events(document.getElementById("kp-events"), view.words, view.events);
    ledger(document.getElementById("kp-ledger"), view.ledger);
    document.documentElement.setAttribute("data-drawn", "1");
    /* The rows exist now: a link the page was opened at (#e12, from the index) is followed again,
       so that its row is scrolled to and styled as the target. */
    if (location.hash.length > 1 && document.getElementById(decodeURIComponent(location.hash.slice(1)))) {
      location.replace(location.hash);
    }
  }

  function failed(error) {
    var notes = document.querySelectorAll(".needs-js");
    for (var n = 0; n < notes.length; n += 1) {
      notes[n].textContent = "This browser could not draw this part of the report (" + error + ").";
    }
  }

  function start() {
    var block = document.getElementById("killpoint-view");
    if (!block) { return; }
    if (typeof DecompressionStream === "undefined") { failed("it has no DecompressionStream"); return; }
    decode(block).then(drawn, failed);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
}());
