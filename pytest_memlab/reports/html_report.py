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
from .backend_words import backend_words
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
#detail th{white-space:normal;max-width:14em;vertical-align:bottom;cursor:auto}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto}
svg text{font:11px system-ui,sans-serif;paint-order:stroke;stroke:#fff;stroke-width:3px}
.legend span{display:inline-block;margin-right:1.2em}
.sw{display:inline-block;width:1em;height:.6em;margin-right:.3em;vertical-align:middle}
.sw.dash{height:0;border-top:2px dashed} .sw.dot{width:.6em;border-radius:50%}
.key{color:#555;font-size:.9em;max-width:75em;margin:.2em 0 .6em}
#index.no-reserved tr>:nth-child(5),#index.no-baseline tr>:nth-child(8){display:none}
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
  // The index's cells, in the words the terminal uses: the own peak with
  // what the test kept past its teardown beside it (left out of the peak),
  // the share of the budget (36x far over it), the change against the
  // baseline (same, +33.3%, +8.0 MiB from nothing, new).
  function peakText(d) {
    if (d.peak === null || d.peak === undefined) return d.measured ? '' : 'not measured';
    return size(d.peak) + (d.kept ? ' (+' + size(d.kept) + ' kept)' : '');
  }
  function useText(d) {
    if (d.max === null || d.max === undefined || d.peak === null || d.peak === undefined) return '';
    if (d.max === 0) return d.peak ? 'inf' : '0%';
    const pct = Math.floor((200 * d.peak + d.max) / (2 * d.max));
    return pct <= 999 ? pct + '%' : Math.floor((2 * d.peak + d.max) / (2 * d.max)) + 'x';
  }
  function useKey(r) { return r.d.max && r.d.peak !== null ? r.d.peak / r.d.max : null; }
  function changeText(d) {
    if (d.baseline === 'new') return 'new';
    if (d.baseline_peak === null || d.baseline_peak === undefined || d.peak === null || d.peak === undefined) return '';
    if (d.peak === d.baseline_peak) return 'same';
    if (d.baseline_peak === 0) return '+' + size(d.peak);
    const v = 100 * (d.peak - d.baseline_peak) / d.baseline_peak;
    return (v >= 0 ? '+' : '') + v.toFixed(1) + '%';
  }
  function changeKey(r) {
    const d = r.d;
    if (d.baseline_peak === null || d.baseline_peak === undefined || d.peak === null) return null;
    if (d.peak === d.baseline_peak) return 0;
    return d.baseline_peak === 0 ? Infinity : (d.peak - d.baseline_peak) / d.baseline_peak;
  }
  // [sort key, cell text] in the order of the index's headers
  const columns = [
    [function (r) { return r.t.nodeid + (Object.keys(r.t.devices).length > 1 ? ' [' + r.dev + ']' : ''); }, null],
    [function (r) { return r.t.outcome; }, null],
    [function (r) { return r.d.peak; }, function (r) { return peakText(r.d); }],
    [function (r) { return r.d.peak_total; }, function (r) { return size(r.d.peak_total); }],
    [function (r) { return r.d.reserved_peak; }, function (r) { return size(r.d.reserved_peak); }],
    [useKey, function (r) { return useText(r.d); }],
    [function (r) { return r.d.leaked; }, function (r) { return size(r.d.leaked); }],
    [changeKey, function (r) { return changeText(r.d); }]
  ];
  let sortCol = 2, sortDir = -1;
  const body = document.getElementById('rows');
  const filter = document.getElementById('filter');
  const onlyFlagged = document.getElementById('flagged');
  function render() {
    const q = filter.value.toLowerCase();
    const key = columns[sortCol][0];
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
        return '<td' + (k === 0 && flag ? ' class="' + flag + '"' : '') + '>' + esc(c[1] ? c[1](r) : c[0](r)) + '</td>';
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
  document.querySelectorAll('#index th').forEach(function (th, k) {
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
  function tip(e, text) { e.appendChild(el('title', {}, text)); return e; }
  // memory by kind: colour and words, in the stacking order (bottom up)
  const KINDS = {parameter: ['#8c564b', 'parameters'], buffer: ['#c49c94', 'buffers'],
                 optimizer_state: ['#ff7f0e', 'optimizer state'], gradient: ['#e377c2', 'gradients'],
                 input: ['#bcbd22', 'inputs'], activation: ['#17becf', 'activations'],
                 temporary: ['#9edae5', 'temporaries'], other: ['#c7c7c7', 'other']};
  // The y axis' ticks: round steps (1, 2 or 5 times a power of ten) in the
  // unit of the axis' top, at most 5 of them above 0; the axis ends at the
  // first tick at or above the data.
  function yTicks(top) {
    let u = 0, scale = 1;
    top = Math.max(top, 1);
    while (top / scale >= 1024 && u < units.length - 1) { scale *= 1024; u++; }
    for (;;) {
      const t = top / scale, raw = t / 5, p = Math.pow(10, Math.floor(Math.log10(raw)));
      let step = [1, 2, 5, 10].map(function (m) { return m * p; }).find(function (s) { return s >= raw * (1 - 1e-9); });
      if (u === 0) step = Math.max(1, Math.round(step));
      const n = Math.max(1, Math.ceil(t / step - 1e-9));
      if (n * step >= 1024 && u < units.length - 1) { scale *= 1024; u++; continue; }
      const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
      const ticks = [];
      for (let k = 0; k <= n; k++) {
        ticks.push([k * step * scale, k === 0 ? '0' : (k * step).toFixed(decimals) + ' ' + units[u]]);
      }
      return ticks;
    }
  }
  // A label that fits between left and right: moved in, else cut (its whole
  // text stays in its tooltip).
  function fitLabel(text, x, left, right) {
    let w = textWidth(text);
    if (x + w > right) { x = Math.max(left, right - w); }
    if (x + w > right) {
      const whole = text.textContent;
      tip(text, whole);
      let keep = whole.length;
      while (keep > 8 && x + w > right) {
        keep = Math.floor(keep * 0.9);
        text.firstChild.textContent = whole.slice(0, keep) + '\u2026';
        w = textWidth(text);
      }
    }
    text.setAttribute('x', x);
    return w;
  }
  // Text widths from a canvas in the font the page's svg text has: no
  // layout of the page is forced while it is still being drawn (a forced
  // layout of an index of thousands of rows would delay it).
  const measure = document.createElement('canvas').getContext('2d');
  measure.font = '11px system-ui,sans-serif';
  function textWidth(text) { return measure.measureText(text.firstChild ? text.firstChild.textContent : '').width; }
  // a label's box (its text starts at x; 11px type on its baseline y)
  function labelBox(text) {
    return {x: +text.getAttribute('x'), y: +text.getAttribute('y') - 10, width: textWidth(text), height: 13};
  }
  function overlap(a, b) {
    return a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
  }
  // The timeline of one test on one device, with its legend, into box.
  function timeline(d, dev, box) {
    const det = d.detail, W = 900, L = 70, R = 20, T = 30, PH = 230, ROW = 14, MAX_ROWS = 4;
    const legend = document.createElement('div');
    legend.className = 'legend';
    box.appendChild(legend);
    const svg = el('svg', {width: W, height: T + PH + 40, class: 'timeline', viewBox: '0 0 ' + W + ' ' + (T + PH + 40)});
    box.appendChild(svg);
    const pts = det.timeline;
    if (!pts.length) { svg.appendChild(el('text', {x: L, y: T + 20}, 'no allocator events')); return; }
    // x: the allocator event's number; what the last event left is held
    // until the test ends, drawn one event wide
    const xmax = Math.max(det.events, pts[pts.length - 1][0]) + 1;
    // the total, where it is not the own bytes (on the CPU it mostly is)
    const sameTotal = pts.every(function (p) { return p[1] === p[3] && p[2] === p[4]; });
    let top = 0;
    pts.forEach(function (p) { top = Math.max(top, p[2], sameTotal ? 0 : p[4]); });
    const ticks = yTicks(Math.max(top, d.peak || 0));
    const ymax = ticks[ticks.length - 1][0];
    const X = function (v) { return L + (W - L - R) * v / xmax; };
    const Y = function (v) { return T + PH * (1 - v / ymax); };
    svg.appendChild(el('rect', {x: L, y: T, width: W - L - R, height: PH, fill: '#fff', stroke: '#999'}));
    ticks.forEach(function (tk) {
      svg.appendChild(el('line', {x1: L, x2: W - R, y1: Y(tk[0]), y2: Y(tk[0]), stroke: '#eee'}));
      svg.appendChild(el('text', {x: L - 6, y: Y(tk[0]) + 4, 'text-anchor': 'end', class: 'y-tick'}, tk[1]));
    });
    // a band from each point's least to its most bytes, held until the next point
    function band(lo, hi, color, cls) {
      const up = [], down = [];
      pts.forEach(function (p, k) {
        const x0 = X(p[0]), x1 = X(k + 1 < pts.length ? pts[k + 1][0] : xmax);
        up.push(x0 + ',' + Y(p[hi]), x1 + ',' + Y(p[hi]));
        down.push(x0 + ',' + Y(p[lo]), x1 + ',' + Y(p[lo]));
      });
      svg.appendChild(el('polygon', {points: up.concat(down.reverse()).join(' '), fill: color,
                                     'fill-opacity': 0.25, stroke: color, 'stroke-width': 1.5, class: cls}));
    }
    // the own bytes by kind (a test with phases), stacked, from the first phase on
    if (det.kinds) {
      const base = pts.map(function () { return 0; });
      const head = el('text', {x: L, y: 17, class: 'kind-title'}, 'own bytes by kind:');
      svg.appendChild(head);
      let lx = L + textWidth(head) + 8;
      Object.keys(KINDS).filter(function (k) { return det.kinds[k]; }).forEach(function (k) {
        const vals = det.kinds[k], up = [], down = [];
        pts.forEach(function (p, i) {
          if (vals[i] === null) return;
          const x0 = X(p[0]), x1 = X(i + 1 < pts.length ? pts[i + 1][0] : xmax);
          down.push(x0 + ',' + Y(base[i]), x1 + ',' + Y(base[i]));
          base[i] += vals[i];
          up.push(x0 + ',' + Y(base[i]), x1 + ',' + Y(base[i]));
        });
        svg.appendChild(el('polygon', {points: up.concat(down.reverse()).join(' '), fill: KINDS[k][0],
                                       'fill-opacity': 0.6, stroke: 'none', class: 'kind', 'data-kind': k}));
        svg.appendChild(el('rect', {x: lx, y: 8, width: 10, height: 10, fill: KINDS[k][0], class: 'kind-key'}));
        const label = el('text', {x: lx + 14, y: 17, class: 'kind-label'}, KINDS[k][1]);
        svg.appendChild(label);
        lx += 14 + textWidth(label) + 12;
      });
    }
    if (!sameTotal) band(3, 4, '#1f77b4', 'total');
    band(1, 2, '#d62728', 'own');
    // Marks and phases: a dashed line each, its label under the x axis at
    // the line's foot, in the first row where it overlaps no other label;
    // a label with no room in MAX_ROWS rows is its line's tooltip.
    const lines = el('g', {class: 'mark-lines'});
    svg.appendChild(lines);
    const items = det.marks.map(function (m) {
      const color = m.kind === 'phase' ? '#2ca02c' : (m.kind === 'oom' ? '#d62728' : '#9467bd');
      const text = el('text', {x: 0, y: 0, fill: color, class: 'mark-label'}, m.label);
      svg.appendChild(text);
      return {m: m, x: X(m.at), color: color, text: text};
    });
    items.forEach(function (it) { it.w = textWidth(it.text); });
    const ends = [];
    let hidden = 0;
    items.forEach(function (it) {
      let x0 = it.x + 2;
      if (x0 + it.w > W - 2) x0 = it.x - 2 - it.w;
      x0 = Math.max(2, x0);
      let r = 0;
      while (r < ends.length && x0 < ends[r] + 6) r++;
      if (r >= MAX_ROWS) { it.text.remove(); it.row = null; hidden++; return; }
      ends[r] = x0 + it.w;
      it.row = r;
      const y = T + PH + ROW + r * ROW;
      it.text.setAttribute('x', x0.toFixed(1));
      it.text.setAttribute('y', y);
      it.text.setAttribute('data-w', it.w.toFixed(1));
      // on a white ground: the lines to the rows below pass behind it
      svg.insertBefore(el('rect', {x: x0 - 1, y: y - 10, width: it.w + 2, height: 13, fill: '#fff', class: 'label-ground'}),
                       it.text);
    });
    items.forEach(function (it) {
      const g = el('g', {class: 'mark-line'});
      g.appendChild(el('line', {x1: it.x, x2: it.x, y1: T, y2: T + PH, stroke: it.color, 'stroke-dasharray': '4 3', class: 'mark'}));
      if (it.row !== null) {
        g.appendChild(el('line', {x1: it.x, x2: it.x, y1: T + PH, y2: T + PH + ROW + it.row * ROW - 10, stroke: it.color}));
      }
      // a wider, unseen line to hover: the label and where it falls
      g.appendChild(tip(el('line', {x1: it.x, x2: it.x, y1: T, y2: T + PH, stroke: 'transparent', 'stroke-width': 7}),
                        it.m.label + ' (allocator event ' + it.m.at + ')'));
      lines.appendChild(g);
    });
    const rowsUsed = ends.length;
    // the own peak: its level, its point, and the line that reached it
    if (det.peak_at !== null && d.peak !== null) {
      const x = X(det.peak_at), y = Y(d.peak);
      svg.appendChild(el('line', {x1: L, x2: x, y1: y, y2: y, stroke: '#d62728', 'stroke-dasharray': '2 3',
                                  'stroke-opacity': 0.7, class: 'peak-level'}));
      svg.appendChild(el('circle', {cx: x, cy: y, r: 5, fill: '#d62728', class: 'peak'}));
      const label = 'own peak ' + size(d.peak) +
        (d.kept ? ' (not counting the ' + size(d.kept) + ' kept past teardown)' : '') +
        (det.peak_line ? ' at ' + det.peak_line : '');
      // above its level where there is room, else below it; beside the
      // point, on the side with room
      const text = el('text', {x: 0, y: y - 10 >= T + 12 ? y - 10 : y + 17, class: 'peak-label'}, label);
      svg.appendChild(text);
      const w = textWidth(text), left = L + 4, right = W - R - 4;
      let tx = x > L + (W - L - R) * 0.6 ? x - 8 - w : x + 8;
      if (tx + w > right && x - 8 - w >= left) tx = x - 8 - w;
      else if (tx < left && x + 8 + w <= right) tx = x + 8;
      fitLabel(text, Math.max(left, tx), left, right);
    }
    // the budget on the own peak, where it falls within the axis (a test
    // over it, or near it)
    const budget = d.max !== null && d.max !== undefined && d.max > 0 && d.max <= ymax;
    if (budget) {
      const y = Y(d.max);
      svg.appendChild(el('line', {x1: L, x2: W - R, y1: y, y2: y, stroke: '#555', 'stroke-dasharray': '6 3',
                                  class: 'budget'}));
      const text = el('text', {x: 0, y: y - 4, fill: '#555', class: 'budget-label'}, 'budget: max ' + size(d.max));
      svg.appendChild(text);
      fitLabel(text, W - R - 4 - textWidth(text), L + 4, W - R - 4);
      const peak = svg.querySelector('.peak-label');
      if (peak && overlap(labelBox(peak), labelBox(text))) text.setAttribute('y', y + 13);
    }
    // what the test kept past its teardown is in the own line (the tensors
    // are its own) but not in its own peak: said at the line's end
    if (d.kept) {
      const last = pts[pts.length - 1];
      const y = Y(last[2]);
      const text = el('text', {x: 0, y: y > T + 40 ? y - 6 : y + 14, 'text-anchor': 'start', class: 'kept-label',
                               fill: '#d62728'}, size(d.kept) + ' kept past teardown (not in the own peak)');
      svg.appendChild(text);
      const w = textWidth(text);
      fitLabel(text, X(xmax) - 4 - w, L + 4, W - R - 4);
      const others = svg.querySelectorAll('.peak-label, .budget-label');
      for (let k = 0; k < others.length && Array.prototype.some.call(others, function (o) {
        return overlap(labelBox(o), labelBox(text));
      }); k++) {
        text.setAttribute('y', +text.getAttribute('y') + 14);
      }
    }
    const H = T + PH + rowsUsed * ROW + 40;
    svg.setAttribute('height', H);
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    svg.appendChild(el('text', {x: (L + W - R) / 2, y: H - 8, 'text-anchor': 'middle', class: 'x-title'},
                       'time, in allocator events (' + det.events + ' in this test; not seconds)' +
                       (hidden ? '; ' + hidden + ' labels had no room: hover their lines' : '')));
    // the legend names what is drawn, each in a few words
    const kinds = {};
    det.marks.forEach(function (m) { kinds[m.kind] = true; });
    const cuda = dev.indexOf('cuda') === 0;
    const parts = ['<span><i class="sw" style="background:#d62728"></i>own: bytes held by tensors this test allocated' +
      (d.kept ? ', the ' + esc(size(d.kept)) + ' it kept past teardown included' : '') + '</span>'];
    if (!sameTotal) {
      parts.push('<span><i class="sw" style="background:#1f77b4"></i>total: ' + (cuda ?
        'all bytes allocated on the GPU, whatever allocated them' :
        'all CPU tensors allocated while memlab measured (the test and its fixtures)') + '</span>');
    } else {
      parts.push('<span class="same-total">total: the same as own here (nothing else was allocated ' +
                 (cuda ? 'on the GPU' : 'while memlab measured') + '), so not drawn apart</span>');
    }
    if (det.peak_at !== null) parts.push('<span><i class="sw dot" style="background:#d62728"></i>own peak</span>');
    if (budget) parts.push('<span><i class="sw dash" style="border-color:#555"></i>budget on the own peak (the marker\'s max)</span>');
    if (kinds.phase) parts.push('<span><i class="sw dash" style="border-color:#2ca02c"></i>start of a phase (forward, backward, optimizer step)</span>');
    if (kinds.mark) parts.push('<span><i class="sw dash" style="border-color:#9467bd"></i>memlab.mark(label) in the test</span>');
    if (kinds.oom) parts.push('<span><i class="sw dash" style="border-color:#d62728"></i>out of memory</span>');
    legend.innerHTML = parts.join('');
  }
  // the figures line of a test's detail
  function figures(t, d, dev) {
    if (!d.measured) {
      return 'not measured on ' + dev + ': ' + (d.reason || 'no reason given') +
        (d.max !== null && d.max !== undefined ? ' (its budget, max ' + size(d.max) + ', was not judged)' : '');
    }
    const cuda = dev.indexOf('cuda') === 0;
    const parts = ['own peak ' + size(d.peak) + (d.kept ? ' (and ' + size(d.kept) + ' kept past teardown, not counted in it)' : '')];
    if (d.max !== null && d.max !== undefined) {
      const use = useText(d);
      parts.push('budget max ' + size(d.max) + (/x$/.test(use) ? ' (' + use + ': the own peak is ' + use.slice(0, -1) +
        ' times it)' : ' (' + use + ' used)'));
    }
    parts.push('total peak ' + size(d.peak_total) + (cuda ? ' (all allocated on the GPU)' : ' (all CPU tensors allocated while memlab measured)'));
    if (d.max_total !== null && d.max_total !== undefined) parts.push('budget max_total ' + size(d.max_total));
    if (d.reserved_peak !== null && d.reserved_peak !== undefined) {
      parts.push('reserved peak ' + size(d.reserved_peak) + ' (held by CUDA\'s caching allocator)');
    }
    if (d.max_reserved !== null && d.max_reserved !== undefined) parts.push('budget max_reserved ' + size(d.max_reserved));
    if (d.leaked !== null && d.leaked !== undefined) parts.push('leaked ' + size(d.leaked));
    const change = changeText(d);
    if (change) {
      parts.push('against the baseline: ' + (change === 'new' ? 'new (not in the baseline)' : change === 'same' ?
        'the same own peak' : change + ' (the baseline\'s own peak: ' + size(d.baseline_peak) + ')'));
    }
    return parts.join('; ') + (t.failed_by_memlab.length ? '; failed by memlab\'s checks: ' + t.failed_by_memlab.join(', ') : '');
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
    p.className = 'figures';
    p.textContent = figures(t, d, dev);
    box.appendChild(p);
    if (d.detail) {
      timeline(d, dev, box);
    } else if (d.measured) {
      // why it is missing, and how to keep it
      const n = document.createElement('p');
      n.className = 'no-timeline';
      n.textContent = 'no timeline: ' + (/^bridge\b/.test(data.backend || '') ? 'the reports keep timelines only for the tests memlab failed, ' +
          'warned of or that ran out of memory (--memlab-details=flagged, the default); ' +
          'run with --memlab-details=all to keep every test\'s' : 'measured from torch.cuda\'s counters only, which hear no single allocation');
      box.appendChild(n);
    }
    if (d.top.length) {
      const tab = document.createElement('table');
      tab.className = 'lines';
      tab.innerHTML = '<tr><th>allocated by the line over the test (not held at once)</th><th style="text-align:left">line</th></tr>' + d.top.map(function (l) {
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
      tab.innerHTML = '<tr><th>change in bytes held at the peak</th><th>held at the baseline\'s peak</th>' +
        '<th>held at this peak</th><th>line</th></tr>' +
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
      ph.className = 'phases';
      ph.textContent = 'own peak while each phase ran: ' + Object.keys(d.phases).map(function (name) {
        const max = (d.phase_max || {})[name];
        return name + ' ' + size(d.phases[name]) + (max !== undefined ? ' (budget ' + name + '=' + size(max) + ')' : '');
      }).join(', ');
      box.appendChild(ph);
    }
    if (d.first_use) {
      const fu = document.createElement('p');
      fu.className = 'first-use';
      fu.textContent = 'first use (memory kept for the process, left out of the own peak): ' + size(d.first_use) +
        ((d.first_use_held || []).length ? ' (' + d.first_use_held.join('; ') + ')' : '');
      box.appendChild(fu);
    }
    if (t.processes && t.processes.length) {
      // each child process (each rank) of the test, its own peak on this
      // device (a CUDA device: the one where its own peak was highest)
      const h3 = document.createElement('h3');
      // across the ranks, each on its own device (by kind: cpu, cuda)
      const a = (t.across_processes || {})[dev.split(':')[0]];
      h3.textContent = t.processes.length + ' processes' + (a && a.processes > 1 ?
        ': max ' + size(a.max) + ' (' + a.worst + '), spread ' + size(a.spread) : '');
      box.appendChild(h3);
      const tab = document.createElement('table');
      tab.id = 'processes';
      tab.innerHTML = '<tr><th>process</th><th>pid</th><th>device</th><th>own peak</th><th>total peak</th><th>line that allocated most (over the process, not held at once)</th></tr>' +
        t.processes.map(function (pr) {
          let f = pr.devices[dev], on = f ? dev : '';
          if (!f && dev.indexOf('cuda') === 0) {
            Object.keys(pr.devices).forEach(function (k) {
              if (k.indexOf('cuda') === 0 && pr.devices[k].peak !== undefined && (!f || pr.devices[k].peak > f.peak)) {
                f = pr.devices[k];
                on = k;
              }
            });
          }
          if (pr.state !== 'done' || !f) {
            return '<tr><td style="text-align:left">' + esc(pr.label) + '</td><td>' + esc(pr.pid) +
              '</td><td colspan="4" style="text-align:left">no figures: ' + esc(pr.why || '') + '</td></tr>';
          }
          const top = (f.top || [])[0];
          return '<tr><td style="text-align:left">' + esc(pr.label) + '</td><td>' + esc(pr.pid) + '</td><td>' +
            esc(on) + '</td><td>' + esc(size(f.peak)) + '</td><td>' + esc(size(f.peak_total)) + '</td><td style="text-align:left">' +
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


# The index's columns: each header, and what it counts (its tooltip).
COLUMNS = (
    ("test", "the test's node id (red: memlab failed it; amber: memlab warned of it); click a row for its timeline"),
    ("outcome", "what pytest said of the test: passed, failed, error (in setup or teardown), skipped"),
    ("own peak", "the most bytes held at once by tensors this test allocated; what it kept past its teardown "
                 "(a leak, a cache filled for the process) is left out of it and shown beside it as (+... kept)"),
    ("total peak", "everything allocated on the device at its highest during the test, whatever allocated it "
                   "(on the CPU: the tensors allocated while memlab measured, the test's fixtures included)"),
    ("reserved peak", "CUDA only: what torch's caching allocator reserved from the GPU at its highest"),
    ("budget use", "the own peak as a share of the budget the marker sets (max=...); far over it, how many times it"),
    ("leaked", "bytes of the test's own tensors still held after its teardown that the leak check counts as leaks"),
    ("vs baseline", "the own peak against the baseline file's: same, the change in percent, the growth from 0 B, "
                    "or new (not in the baseline)"),
)


def _environment_words(environment: dict, backend: str) -> str:
    """The header's line: what ran the tests and how memlab measured them,
    in words (the backend's library name stays in the JSON)."""
    parts = []
    if environment.get("python"):
        parts.append(f"Python {environment['python']}")
    device = environment.get("device")
    if device and device != "cpu":
        parts.append(f"GPU {device}")
    if environment.get("cuda"):
        parts.append(f"torch built for CUDA {environment['cuda']}")
    how = backend_words(backend, environment.get("torch"))
    if not how and environment.get("torch"):
        parts.append(f"torch {environment['torch']}")
    return ", ".join(parts) + (f"; {how}" if how else "")


def render(results: dict, environment: dict, backend: str, caches: list = ()) -> str:
    report = json_report.build(results, environment, backend, caches)
    # Inside a <script> data block, "</" could end the element early, and
    # "<!--" followed by "<script" would make the parser swallow the page's
    # next script: JSON's \u003c escape says the same to JSON.parse.
    payload = json.dumps(report, separators=(",", ":"), sort_keys=True).replace("<", "\\u003c")
    s = report["summary"]
    devices = [d for t in report["tests"] for d in t["devices"].values()]
    # columns with nothing to say in this run are left out of sight (their
    # place stays, so that #sort=N means the same column in every report)
    hidden = []
    if all(d["reserved_peak"] is None for d in devices):
        hidden.append("no-reserved")
    if all(d["baseline_peak"] is None and d["baseline"] is None for d in devices):
        hidden.append("no-baseline")
    headers = "".join(f"<th title=\"{html.escape(why)}\">{html.escape(name)}</th>" for name, why in COLUMNS)
    key = ("own peak: the most bytes this test's own tensors held at once, without what it kept past its "
           "teardown (shown beside it as +... kept) &middot; total peak: all bytes allocated on the device at "
           "their highest during the test (on the CPU: only the tensors allocated while memlab measured it) "
           "&middot; budget use: own peak &divide; the marker's max &middot; leaked: kept past teardown and "
           "counted as a leak")
    if "no-baseline" not in hidden:
        key += " &middot; vs baseline: the own peak against the baseline file's"
    key += (". A name in red: memlab failed the test; in amber: memlab warned of it. Hover a column's name for more; click it to sort; "
            "click a row for its timeline.")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>pytest-memlab report</title>"
        f"<style>{_STYLE}</style></head><body>"
        "<h1>pytest-memlab report</h1>"
        f"<div class=\"env\">{html.escape(_environment_words(environment, backend))}<br>"
        f"{s['measured']} of {s['tests']} tests measured; memlab failed {s['failed_by_memlab']} and "
        f"warned of {s['warned']}</div>"
        "<div id=\"filters\"><input type=\"search\" id=\"filter\" placeholder=\"filter by test name\"> "
        "<label><input type=\"checkbox\" id=\"flagged\"> only tests memlab failed or warned of</label> "
        "<span id=\"count\"></span></div>"
        f"<p class=\"key\">{key}</p>"
        f"<table id=\"index\" class=\"{' '.join(hidden)}\"><thead><tr>{headers}</tr></thead>"
        "<tbody id=\"rows\"></tbody></table>"
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
