"""The HTML report (``--memlab-html=PATH``, ``--memlab-report=html:PATH``):
one self-contained file, nothing loaded from the network.

An index of every measured test (sortable by any column, filterable by
name and by what memlab found), and per test its memory timeline as SVG:
own and total bytes over the test's allocator events (each drawn as the
band between the least and the most bytes of a point, so a downsampled
spike still shows at its height), the own peak marked and labelled with the
line that reached it, the marks and phases, the heaviest lines and the leak
report.  The data rides in the page as JSON (the same rows as the JSON
report) and a test's timeline is drawn when it is opened, so that a suite
of thousands of tests still opens at once.  The address can carry the
view: ``#filter=TEXT&sort=COLUMN&desc=1&test=N`` (N in node id order).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from . import json_report
from ..atomic_files import write_atomic
from ..sizes import format_size

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em} .env{color:#555;margin-bottom:1em}
table{border-collapse:collapse} th,td{padding:.25em .6em;text-align:right;white-space:nowrap}
th{cursor:pointer;background:#f0f0f0;position:sticky;top:0} th:first-child,td:first-child{text-align:left}
tr.row:hover{background:#eef5ff;cursor:pointer} tr.sel{background:#dbe9ff}
td.failed{color:#b00020;font-weight:600} td.warned{color:#a15c00}
#filters{margin:.6em 0} #filters input[type=search]{width:28em;padding:.2em}
#detail{margin-top:1.2em;border-top:2px solid #ccc;padding-top:.6em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto}
svg text{font:11px system-ui,sans-serif;paint-order:stroke;stroke:#fff;stroke-width:3px}
.legend span{display:inline-block;margin-right:1.2em}
.sw{display:inline-block;width:1em;height:.6em;margin-right:.3em;vertical-align:middle}
"""

# Drawn in the page: a few hundred lines of plain JavaScript, no library.
_SCRIPT = r"""
(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('memlab-data').textContent);
  const rows = [];
  data.tests.forEach(function (t, i) {
    Object.keys(t.devices).forEach(function (dev) { rows.push({i: i, t: t, dev: dev, d: t.devices[dev]}); });
  });
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  function size(b) {
    if (b === null || b === undefined) return '';
    let v = b, u = 0, sign = v < 0 ? '-' : '';
    v = Math.abs(v);
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return sign + (u === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + units[u];
  }
  function use(r) { return r.d.max && r.d.peak !== null ? r.d.peak / r.d.max : null; }
  function change(r) {
    if (r.d.baseline === 'new') return 'new';
    return r.d.baseline_peak && r.d.peak !== null ? (r.d.peak - r.d.baseline_peak) / r.d.baseline_peak : null;
  }
  const columns = [
    ['test', function (r) { return r.t.nodeid + (Object.keys(r.t.devices).length > 1 ? ' [' + r.dev + ']' : ''); }, null],
    ['outcome', function (r) { return r.t.outcome; }, null],
    ['own peak', function (r) { return r.d.peak; }, size],
    ['total peak', function (r) { return r.d.peak_total; }, size],
    ['reserved peak', function (r) { return r.d.reserved_peak; }, size],
    ['max use', use, function (v) { return v === null ? '' : Math.floor(100 * v + 0.5) + '%'; }],
    ['leaked', function (r) { return r.d.leaked; }, size],
    ['vs baseline', change, function (v) {
      return v === null ? '' : typeof v === 'string' ? v : (v >= 0 ? '+' : '') + (100 * v).toFixed(1) + '%';
    }]
  ];
  let sortCol = 2, sortDir = -1;
  const body = document.getElementById('rows');
  const filter = document.getElementById('filter');
  const onlyFlagged = document.getElementById('flagged');
  function render() {
    const q = filter.value.toLowerCase();
    const key = columns[sortCol][1];
    const shown = rows.filter(function (r) {
      if (q && r.t.nodeid.toLowerCase().indexOf(q) < 0) return false;
      return !onlyFlagged.checked || r.t.failed_by_memlab.length || r.t.warned.length;
    });
    shown.sort(function (a, b) {
      const x = key(a), y = key(b);
      if (x === y) return a.i - b.i;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sortDir;
    });
    const html = [];
    shown.forEach(function (r) {
      const flag = r.t.failed_by_memlab.length ? 'failed' : (r.t.warned.length ? 'warned' : '');
      html.push('<tr class="row" data-i="' + r.i + '" data-dev="' + esc(r.dev) + '">' + columns.map(function (c, k) {
        const v = c[1](r);
        return '<td' + (k === 0 && flag ? ' class="' + flag + '"' : '') + '>' + esc(c[2] ? c[2](v) : v) + '</td>';
      }).join('') + '</tr>');
    });
    body.innerHTML = html.join('');
    document.getElementById('count').textContent = shown.length + ' of ' + rows.length + ' shown';
  }
  function esc(s) {
    return String(s === null || s === undefined ? '' : s).replace(/[&<>"]/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c];
    });
  }
  document.querySelectorAll('th').forEach(function (th, k) {
    th.addEventListener('click', function () {
      if (sortCol === k) sortDir = -sortDir; else { sortCol = k; sortDir = k < 2 ? 1 : -1; }
      render();
    });
  });
  filter.addEventListener('input', render);
  onlyFlagged.addEventListener('change', render);
  body.addEventListener('click', function (e) {
    const tr = e.target.closest('tr.row');
    if (tr) show(+tr.dataset.i, tr.dataset.dev);
  });

  const NS = 'http://www.w3.org/2000/svg';
  function el(name, attrs, text) {
    const e = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // memory by kind: colour and words, in the stacking order (bottom up)
  const KINDS = {parameter: ['#8c564b', 'parameters'], buffer: ['#c49c94', 'buffers'],
                 optimizer_state: ['#ff7f0e', 'optimizer state'], gradient: ['#e377c2', 'gradients'],
                 input: ['#bcbd22', 'inputs'], activation: ['#17becf', 'activations'],
                 temporary: ['#9edae5', 'temporaries'], other: ['#c7c7c7', 'other']};
  function timeline(d) {
    const det = d.detail, W = 900, H = 300, L = 70, R = 20, T = 30, B = 40;
    const svg = el('svg', {width: W, height: H, class: 'timeline', viewBox: '0 0 ' + W + ' ' + H});
    const pts = det.timeline;
    if (!pts.length) { svg.appendChild(el('text', {x: L, y: T + 20}, 'no allocator events')); return svg; }
    const xmax = Math.max(det.events, 1);
    let ymax = 1;
    pts.forEach(function (p) { ymax = Math.max(ymax, p[2], p[4]); });
    const X = function (v) { return L + (W - L - R) * v / xmax; };
    const Y = function (v) { return T + (H - T - B) * (1 - v / ymax); };
    svg.appendChild(el('rect', {x: L, y: T, width: W - L - R, height: H - T - B, fill: '#fff', stroke: '#999'}));
    for (let k = 0; k <= 4; k++) {
      const v = ymax * k / 4;
      svg.appendChild(el('line', {x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: '#eee'}));
      svg.appendChild(el('text', {x: L - 6, y: Y(v) + 4, 'text-anchor': 'end'}, size(v)));
    }
    svg.appendChild(el('text', {x: (L + W - R) / 2, y: H - 8, 'text-anchor': 'middle'},
                       'allocator events (' + det.events + ')'));
    // a band from each point's least to its most bytes, held until the next point
    function band(lo, hi, color, cls) {
      const up = [], down = [];
      pts.forEach(function (p, k) {
        const x0 = X(p[0]), x1 = X(k + 1 < pts.length ? pts[k + 1][0] : det.events);
        up.push(x0 + ',' + Y(p[hi]), x1 + ',' + Y(p[hi]));
        down.push(x0 + ',' + Y(p[lo]), x1 + ',' + Y(p[lo]));
      });
      svg.appendChild(el('polygon', {points: up.concat(down.reverse()).join(' '), fill: color,
                                     'fill-opacity': 0.25, stroke: color, 'stroke-width': 1.5, class: cls}));
    }
    // the own bytes by kind (a test with phases), stacked, from the first phase on
    if (det.kinds) {
      const base = pts.map(function () { return 0; });
      let lx = L;
      Object.keys(KINDS).filter(function (k) { return det.kinds[k]; }).forEach(function (k) {
        const vals = det.kinds[k], up = [], down = [];
        pts.forEach(function (p, i) {
          if (vals[i] === null) return;
          const x0 = X(p[0]), x1 = X(i + 1 < pts.length ? pts[i + 1][0] : det.events);
          down.push(x0 + ',' + Y(base[i]), x1 + ',' + Y(base[i]));
          base[i] += vals[i];
          up.push(x0 + ',' + Y(base[i]), x1 + ',' + Y(base[i]));
        });
        svg.appendChild(el('polygon', {points: up.concat(down.reverse()).join(' '), fill: KINDS[k][0],
                                       'fill-opacity': 0.6, stroke: 'none', class: 'kind', 'data-kind': k}));
        svg.appendChild(el('rect', {x: lx, y: 8, width: 10, height: 10, fill: KINDS[k][0], class: 'kind-key'}));
        svg.appendChild(el('text', {x: lx + 14, y: 17, class: 'kind-label'}, KINDS[k][1]));
        lx += 24 + 7 * KINDS[k][1].length;
      });
    }
    band(3, 4, '#1f77b4', 'total');
    band(1, 2, '#d62728', 'own');
    const taken = [];
    det.marks.forEach(function (m) {
      const x = X(m.at), color = m.kind === 'phase' ? '#2ca02c' : (m.kind === 'oom' ? '#d62728' : '#9467bd');
      svg.appendChild(el('line', {x1: x, x2: x, y1: T, y2: H - B, stroke: color, 'stroke-dasharray': '4 3', class: 'mark'}));
      // along its line, upwards from the bottom (the peak's label is at the
      // top); marks on (nearly) one event step aside
      let lx = x - 3;
      while (taken.some(function (t) { return Math.abs(t - lx) < 12; })) lx += 12;
      taken.push(lx);
      const ly = H - B - 4;
      svg.appendChild(el('text', {x: lx, y: ly, fill: color, class: 'mark-label',
                                  transform: 'rotate(-90 ' + lx + ' ' + ly + ')'}, m.label));
    });
    if (det.peak_at !== null) {
      const x = X(det.peak_at), y = Y(d.peak);
      svg.appendChild(el('circle', {cx: x, cy: y, r: 5, fill: '#d62728', class: 'peak'}));
      const label = 'own peak ' + size(d.peak) + (det.peak_line ? ' at ' + det.peak_line : '');
      svg.appendChild(el('text', {x: Math.min(x + 8, W - R - 6), y: Math.max(y - 8, T + 12), class: 'peak-label',
                                  'text-anchor': x > W * 0.6 ? 'end' : 'start'}, label));
    }
    return svg;
  }
  function show(i, dev) {
    const t = data.tests[i], d = t.devices[dev];
    document.querySelectorAll('tr.sel').forEach(function (tr) { tr.classList.remove('sel'); });
    const tr = body.querySelector('tr[data-i="' + i + '"][data-dev="' + dev + '"]');
    if (tr) tr.classList.add('sel');
    const box = document.getElementById('detail');
    box.innerHTML = '';
    const h = document.createElement('h2');
    h.textContent = t.nodeid + ' (' + dev + (d.gpu ? ': the machine\'s GPU ' + d.gpu : '') + ', ' + t.outcome + ')';
    box.appendChild(h);
    const p = document.createElement('p');
    p.textContent = 'own peak ' + size(d.peak) + ', total peak ' + size(d.peak_total) +
      (d.reserved_peak !== null ? ', reserved peak ' + size(d.reserved_peak) : '') +
      (d.max ? ', max ' + size(d.max) : '') + ', leaked ' + size(d.leaked) +
      (t.failed_by_memlab.length ? '; failed by memlab: ' + t.failed_by_memlab.join(', ') : '');
    box.appendChild(p);
    if (d.detail) {
      const legend = document.createElement('div');
      legend.className = 'legend';
      legend.innerHTML = '<span><i class="sw" style="background:#d62728"></i>own bytes (allocated in this test)</span>' +
        '<span><i class="sw" style="background:#1f77b4"></i>device total</span>' +
        '<span><i class="sw" style="background:#2ca02c"></i>phases</span><span><i class="sw" style="background:#9467bd"></i>marks</span>';
      box.appendChild(legend);
      box.appendChild(timeline(d));
    } else {
      // why it is missing, and how to keep it
      const n = document.createElement('p');
      n.className = 'no-timeline';
      n.textContent = 'no timeline: ' + (!d.measured ? (d.reason || 'not measured') :
        (/bridge/.test(data.backend || '') ? 'the reports keep timelines only for the tests memlab failed, ' +
          'warned of or that ran out of memory (--memlab-details=flagged, the default); ' +
          'run with --memlab-details=all to keep every test\'s' : 'measured without the torch bridge'));
      box.appendChild(n);
    }
    if (d.top.length) {
      const tab = document.createElement('table');
      tab.innerHTML = '<tr><th>bytes allocated</th><th>line</th></tr>' + d.top.map(function (l) {
        return '<tr><td>' + esc(size(l.bytes)) + '</td><td style="text-align:left">' +
          esc(l.file + ':' + l.line + ' ' + l.function) + '</td></tr>';
      }).join('');
      box.appendChild(tab);
    }
    (t.out_of_memory || []).forEach(function (o) {
      if (o.device !== dev) return;
      const pre = document.createElement('pre');
      pre.className = 'oom';
      pre.textContent = (o.caught ? '(caught by the test) ' : '') + o.text;
      box.appendChild(pre);
    });
    if (d.detail && d.detail.leak) {
      const pre = document.createElement('pre');
      pre.textContent = d.detail.leak;
      box.appendChild(pre);
    }
    if (d.site_changes && d.site_changes.length) {
      // against the baseline: what grew where, then what shrank
      const tab = document.createElement('table');
      tab.innerHTML = '<tr><th>change at the peak</th><th>baseline</th><th>now</th><th>line</th></tr>' +
        d.site_changes.map(function (c) {
          const delta = c.new - c.old;
          return '<tr><td>' + (delta > 0 ? '+' : '-') + esc(size(Math.abs(delta))) + '</td><td>' + esc(size(c.old)) +
            '</td><td>' + esc(size(c.new)) + '</td><td style="text-align:left">' +
            esc(c.file + ' ' + c.function + ': ' + c.text) + '</td></tr>';
        }).join('');
      box.appendChild(tab);
    }
    if (d.phases && Object.keys(d.phases).length) {
      // each phase's own peak, and its budget where the marker gave one
      const ph = document.createElement('p');
      ph.textContent = 'peak by phase: ' + Object.keys(d.phases).map(function (name) {
        const max = (d.phase_max || {})[name];
        return name + ' ' + size(d.phases[name]) + (max !== undefined ? ' (' + name + '=' + size(max) + ')' : '');
      }).join(', ');
      box.appendChild(ph);
    }
    if (d.first_use) {
      const fu = document.createElement('p');
      fu.textContent = 'first use (kept for the process, left out of the own peak): ' + size(d.first_use) +
        ((d.first_use_held || []).length ? ': ' + d.first_use_held.join('; ') : '');
      box.appendChild(fu);
    }
    if (t.processes && t.processes.length) {
      // each child process (each rank) of the test, its own peak on this
      // device (a CUDA device: the one where its own peak was highest)
      const h3 = document.createElement('h3');
      const a = (t.across_processes || {})[dev];
      h3.textContent = t.processes.length + ' processes' + (a && a.processes > 1 ?
        ': max ' + size(a.max) + ' (' + a.worst + '), spread ' + size(a.spread) : '');
      box.appendChild(h3);
      const tab = document.createElement('table');
      tab.id = 'processes';
      tab.innerHTML = '<tr><th>process</th><th>pid</th><th>own peak</th><th>total peak</th><th>heaviest line</th></tr>' +
        t.processes.map(function (pr) {
          let f = pr.devices[dev];
          if (!f && dev.indexOf('cuda') === 0) {
            Object.keys(pr.devices).forEach(function (k) {
              if (k.indexOf('cuda') === 0 && pr.devices[k].peak !== undefined && (!f || pr.devices[k].peak > f.peak)) f = pr.devices[k];
            });
          }
          if (pr.state !== 'done' || !f) {
            return '<tr><td style="text-align:left">' + esc(pr.label) + '</td><td>' + esc(pr.pid) +
              '</td><td colspan="3" style="text-align:left">no figures: ' + esc(pr.why || '') + '</td></tr>';
          }
          const top = (f.top || [])[0];
          return '<tr><td style="text-align:left">' + esc(pr.label) + '</td><td>' + esc(pr.pid) + '</td><td>' +
            esc(size(f.peak)) + '</td><td>' + esc(size(f.peak_total)) + '</td><td style="text-align:left">' +
            (top ? esc(size(top.bytes) + ' ' + top.file + ':' + top.line + ' ' + top.function) : '') + '</td></tr>';
        }).join('');
      box.appendChild(tab);
    }
  }
  // the address can carry the view: #filter=TEXT&sort=COLUMN&desc=1&test=N
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has('filter')) filter.value = params.get('filter');
  if (params.has('sort') && columns[+params.get('sort')]) {
    sortCol = +params.get('sort');
    sortDir = params.get('desc') === '1' ? -1 : 1;
  }
  render();
  const m = /test=(\d+)/.exec(location.hash);
  if (m && data.tests[+m[1]]) show(+m[1], Object.keys(data.tests[+m[1]].devices)[0]);
  else if (rows.length) {
    // the first test memlab failed or warned of (or that ran out of memory), else the first
    const first = rows.find(function (r) {
      return r.t.failed_by_memlab.length || r.t.warned.length || (r.t.out_of_memory || []).length;
    }) || rows[0];
    show(first.i, first.dev);
  }
  // when the page was ready, from the start of navigation (bench/bench_report.py reads it)
  document.documentElement.setAttribute('data-ready-ms', performance.now().toFixed(0));
})();
"""


def render(results: dict, environment: dict, backend: str, caches: list = ()) -> str:
    report = json_report.build(results, environment, backend, caches)
    # Inside a <script> data block, "</" could end the element early, and
    # "<!--" followed by "<script" would make the parser swallow the page's
    # next script: JSON's \u003c escape says the same to JSON.parse.
    payload = json.dumps(report, separators=(",", ":"), sort_keys=True).replace("<", "\\u003c")
    env = ", ".join(f"{k} {v}" for k, v in sorted(environment.items()) if v)
    s = report["summary"]
    headers = "".join(f"<th>{h}</th>" for h in ("test", "outcome", "own peak", "total peak", "reserved peak",
                                                  "max use", "leaked", "vs baseline"))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>pytest-memlab report</title>"
        f"<style>{_STYLE}</style></head><body>"
        "<h1>pytest-memlab report</h1>"
        f"<div class=\"env\">{html.escape(env)}; {html.escape(backend or '')}<br>"
        f"{s['measured']} measured of {s['tests']} tests; {s['failed_by_memlab']} failed by memlab, "
        f"{s['warned']} warned</div>"
        "<div id=\"filters\"><input type=\"search\" id=\"filter\" placeholder=\"filter by test name\"> "
        "<label><input type=\"checkbox\" id=\"flagged\"> only tests memlab failed or warned of</label> "
        "<span id=\"count\"></span></div>"
        f"<table><thead><tr>{headers}</tr></thead><tbody id=\"rows\"></tbody></table>"
        + _caches(report["caches"]) +
        "<div id=\"detail\"></div>"
        # Any script error is left on the page, where a test (or a person) finds it.
        "<script>window.addEventListener('error',function(e){document.documentElement.setAttribute("
        "'data-errors',(document.documentElement.getAttribute('data-errors')||'')+e.message+';');});</script>"
        f"<script id=\"memlab-data\" type=\"application/json\">{payload}</script>"
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


def _caches(caches: list) -> str:
    """Memory kept by caches, once each: the holder, its bytes, the tests
    that filled it."""
    if not caches:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(c['device'])}</td><td>{html.escape(c['holder'])}</td>"
        f"<td>{html.escape(format_size(c['bytes']))}</td><td>{html.escape(', '.join(c['tests']))}</td></tr>"
        for c in caches)
    return ("<h2>caches (kept once, not grown by each test that uses them)</h2><table id=\"caches\">"
            f"<thead><tr><th>device</th><th>holder</th><th>bytes</th><th>filled by</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def write(path, results: dict, environment: dict, backend: str, caches: list = ()) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, render(results, environment, backend, caches))
