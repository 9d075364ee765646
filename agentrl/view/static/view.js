// agentrl view: the little JavaScript the server-rendered pages need. No build step, no dependencies beyond the
// vendored uPlot: draws the curves (polling for new metrics rows while a run trains), the eval charts, and colours
// tokens by the chosen value with a hover card.
(function () {
  "use strict";

  function readJSON(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }
  var CONFIG = readJSON("agentrl-config") || { live: false, token: "" };
  var COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];

  // ------------------------------------------------------------------------------------------------ curves
  var curves = readJSON("curves-data");
  var charts = {};        // metric -> uPlot
  var chartKeys = [];     // metric names drawn, in order
  window.agentrlCharts = charts;

  function numericKeys(runs) {
    var seen = {}, keys = [];
    runs.forEach(function (run) {
      run.rows.forEach(function (row) {
        Object.keys(row).forEach(function (k) {
          if (k !== "step" && !seen[k] && (typeof row[k] === "number")) { seen[k] = 1; keys.push(k); }
        });
      });
    });
    return keys;
  }

  function xOf(run, axis) {
    // Wall clock: the row's own time when the trainer wrote one, else the step durations summed.
    var t = 0;
    return run.rows.map(function (row) {
      if (axis === "step") return row.step;
      if (typeof row.time === "number") return row.time;
      t += (typeof row.step_seconds === "number" ? row.step_seconds : 0);
      return t;
    });
  }

  function smooth(ys, alpha) {
    if (!(alpha > 0)) return ys;
    var out = [], last = null;
    ys.forEach(function (y) {
      if (y === null || y === undefined) { out.push(null); return; }
      last = last === null ? y : alpha * last + (1 - alpha) * y;
      out.push(last);
    });
    return out;
  }

  function chartData(key, axis, alpha) {
    // One x array for all runs (uPlot needs a shared x): the sorted union; each run's y aligned to it with nulls.
    var xs = {}, perRun = [];
    curves.runs.forEach(function (run) {
      var x = xOf(run, axis), y = smooth(run.rows.map(function (r) {
        return typeof r[key] === "number" ? r[key] : null;
      }), alpha);
      var m = {};
      x.forEach(function (v, i) { xs[v] = 1; m[v] = y[i]; });
      perRun.push(m);
    });
    var xsorted = Object.keys(xs).map(Number).sort(function (a, b) { return a - b; });
    var data = [xsorted];
    var points = 0;
    perRun.forEach(function (m) {
      data.push(xsorted.map(function (v) {
        var y = (v in m) ? m[v] : null;
        if (y !== null && y !== undefined) points += 1;
        return y === undefined ? null : y;
      }));
    });
    return { data: data, points: points };
  }

  function yRange(u, min, max) {
    // uPlot's tick search runs away on spans near float noise (a KL of 1e-14): pad those to a readable span.
    if (min === null || max === null) return [0, 1];
    var span = max - min, mag = Math.max(Math.abs(min), Math.abs(max));
    if (span < 1e-12 || span < mag * 1e-6) {
      var pad = Math.max(mag * 0.1, 1e-6);
      return [min - pad, max + pad];
    }
    return uPlot.rangeNum(min, max, 0.1, true);
  }

  function drawCurves() {
    var box = document.getElementById("curves");
    if (!box || !curves) return;
    var axis = (document.getElementById("x-axis") || {}).value || "step";
    var alpha = parseFloat((document.getElementById("smoothing") || {}).value || "0");
    var filter = ((document.getElementById("metric-filter") || {}).value || "").toLowerCase();
    box.innerHTML = "";
    Object.keys(charts).forEach(function (k) { delete charts[k]; });
    chartKeys = numericKeys(curves.runs);
    var width = Math.max(260, Math.floor((box.clientWidth || 900) / 3) - 16);
    chartKeys.forEach(function (key) {
      if (filter && key.toLowerCase().indexOf(filter) < 0) return;
      var cell = document.createElement("div");
      cell.className = "chart";
      cell.dataset.metric = key;
      box.appendChild(cell);
      var d = chartData(key, axis, alpha);
      cell.dataset.points = d.points;
      var series = [{ label: axis === "step" ? "step" : "seconds" }];
      curves.runs.forEach(function (run, i) {
        series.push({ label: run.name, stroke: COLOURS[i % COLOURS.length], width: 1.5, spanGaps: true,
                      points: { show: true, size: 4 } });
      });
      charts[key] = new uPlot({ title: key, width: width, height: 180, series: series,
                                scales: { x: { time: false }, y: { range: yRange } }, legend: { show: curves.runs.length > 1 } },
                              d.data, cell);
    });
  }

  function refreshCurves() {
    var axis = (document.getElementById("x-axis") || {}).value || "step";
    var alpha = parseFloat((document.getElementById("smoothing") || {}).value || "0");
    var keys = numericKeys(curves.runs);
    if (keys.length !== chartKeys.length) { drawCurves(); return; }
    Object.keys(charts).forEach(function (key) {
      var d = chartData(key, axis, alpha);
      charts[key].setData(d.data);
      charts[key].root.parentNode.dataset.points = d.points;
    });
  }

  function poll() {
    var pending = curves.runs.map(function (run) {
      return fetch("/api/run/" + run.index + "/metrics?since=" + run.rows.length, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : { rows: [] }; })
        .then(function (body) {
          if (body.rows && body.rows.length) { run.rows = run.rows.concat(body.rows); return true; }
          return false;
        })
        .catch(function () { return false; });
    });
    Promise.all(pending).then(function (grew) {
      curves.runs.forEach(function (run) {
        var el = document.getElementById("steps-" + run.index);
        if (el) el.textContent = String(run.rows.length);
      });
      if (grew.some(Boolean)) refreshCurves();
    });
  }

  if (curves) {
    drawCurves();
    ["x-axis", "smoothing", "metric-filter"].forEach(function (id) {
      var el = document.getElementById(id);
      if (el) el.addEventListener("input", drawCurves);
    });
    if (CONFIG.live) setInterval(poll, 2000);
  }

  // ------------------------------------------------------------------------------------------------ eval charts
  function bandPlugin(low, high, colour) {
    return { hooks: { draw: function (u) {
      var ctx = u.ctx;
      ctx.save();
      ctx.strokeStyle = colour;
      ctx.lineWidth = 1.5 * devicePixelRatio;
      for (var i = 0; i < low.length; i++) {
        if (low[i] === null || high[i] === null) continue;
        var x = u.valToPos(u.data[0][i], "x", true) + (u._barShift || 0);
        ctx.beginPath();
        ctx.moveTo(x, u.valToPos(low[i], "y", true));
        ctx.lineTo(x, u.valToPos(high[i], "y", true));
        ctx.stroke();
      }
      ctx.restore();
    } } };
  }

  document.querySelectorAll(".eval-chart").forEach(function (cell) {
    var spec = JSON.parse(cell.querySelector("script").textContent);
    var bars = spec.kind === "bars" && uPlot.paths && uPlot.paths.bars;
    var n = spec.series.length;
    var series = [{ label: "x" }], plugins = [], data = [spec.x];
    spec.series.forEach(function (s, i) {
      var colour = COLOURS[i % COLOURS.length];
      var opts = { label: s.label, stroke: colour, width: 1.5, fill: bars ? colour + "99" : colour + "22" };
      if (bars) {
        opts.paths = uPlot.paths.bars({ size: [0.8 / n, 60], align: 0, disp: { x0: { unit: 2, values: function (u) {
          return u.data[0].map(function () { return (i - (n - 1) / 2) * (0.8 / n); });
        } } } });
        opts.points = { show: false };
      } else {
        opts.points = { show: true, size: 5 };
      }
      series.push(opts);
      data.push(s.values);
      if (s.low && s.high) plugins.push(bandPlugin(s.low, s.high, "#444"));
    });
    var axes = [{}, {}];
    if (spec.xlabels) {
      axes[0] = { values: function (u, splits) {
        return splits.map(function (v) { return spec.xlabels[v] !== undefined && v === Math.round(v) ? spec.xlabels[v] : ""; });
      } };
    }
    var xs = spec.x.length ? spec.x : [0];
    var pad = spec.kind === "bars" ? (xs.length > 1 ? (xs[1] - xs[0]) / 2 : 0.5) : 0;
    new uPlot({ title: spec.title, width: 420, height: 240, series: series, axes: axes, plugins: plugins,
                scales: { x: { time: false, range: function () { return [xs[0] - pad, xs[xs.length - 1] + pad]; } } } },
              data, cell);
    cell.dataset.drawn = "1";
  });

  // ------------------------------------------------------------------------------------------------ tokens
  var tip = null;
  function tipEl() {
    if (!tip) { tip = document.createElement("div"); tip.className = "token-tip"; document.body.appendChild(tip); }
    return tip;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "number") return Number(v.toPrecision(4)).toString();
    return String(v);
  }
  function valueOf(vals, mode, i) {
    if (mode === "mismatch") {
      var a = vals.trainer_logprob[i], b = vals.sampler_logprob[i];
      return (a === null || b === null) ? null : a - b;
    }
    return vals[mode] ? vals[mode][i] : null;
  }
  function colour(mode, v) {
    if (v === null || v === undefined) return "";
    var t;
    if (mode === "loss_mask") return v ? "rgba(44,160,44,0.35)" : "";
    if (mode === "sampler_logprob" || mode === "trainer_logprob") {   // low probability: red
      t = 1 - Math.exp(Math.max(-20, Math.min(0, v)));
      return "rgba(214,39,40," + (0.08 + 0.8 * t).toFixed(3) + ")";
    }
    if (mode === "entropy") { t = Math.min(1, v / 5); return "rgba(148,103,189," + (0.08 + 0.8 * t).toFixed(3) + ")"; }
    if (mode === "is_weight") v = Math.log(Math.max(v, 1e-6));        // symmetric around weight 1
    t = Math.max(-1, Math.min(1, v));                                  // mismatch, log weight, advantage
    return t >= 0 ? "rgba(31,119,180," + (0.08 + 0.8 * t).toFixed(3) + ")"
                  : "rgba(214,39,40," + (0.08 - 0.8 * t).toFixed(3) + ")";
  }
  function paintTokens() {
    var select = document.querySelector(".token-mode");
    var mode = select ? select.value : "loss_mask";
    document.querySelectorAll(".tokens").forEach(function (box) {
      var vals = JSON.parse(document.getElementById(box.dataset.values).textContent);
      box.querySelectorAll(".t").forEach(function (span, i) {
        span.style.background = colour(mode, valueOf(vals, mode, i));
      });
    });
  }
  document.querySelectorAll(".tokens").forEach(function (box) {
    var vals = null;
    box.addEventListener("mouseover", function (ev) {
      var span = ev.target.closest(".t");
      if (!span) return;
      vals = vals || JSON.parse(document.getElementById(box.dataset.values).textContent);
      var i = Array.prototype.indexOf.call(box.querySelectorAll(".t"), span);
      var lines = ["token " + i + ": id " + vals.ids[i] + " " + JSON.stringify(span.dataset.text || span.textContent),
                   "loss mask " + fmt(vals.loss_mask[i]), "sampler log-prob " + fmt(vals.sampler_logprob[i]),
                   "trainer log-prob " + fmt(vals.trainer_logprob[i]), "mismatch " + fmt(valueOf(vals, "mismatch", i)),
                   "IS weight " + fmt(vals.is_weight[i]) + (vals.is_masked[i] ? " (masked / truncated)" : ""),
                   "advantage " + fmt(vals.advantage[i]), "entropy " + fmt(vals.entropy[i])];
      var el = tipEl();
      el.textContent = lines.join("\n");
      el.style.display = "block";
      var r = span.getBoundingClientRect();
      el.style.left = (window.scrollX + r.left) + "px";
      el.style.top = (window.scrollY + r.bottom + 4) + "px";
    });
    box.addEventListener("mouseleave", function () { if (tip) tip.style.display = "none"; });
  });
  document.querySelectorAll(".token-mode").forEach(function (select) {
    select.addEventListener("change", function () {   // one mode for the whole page (the export holds many)
      document.querySelectorAll(".token-mode").forEach(function (s) { s.value = select.value; });
      paintTokens();
    });
  });
  if (document.querySelector(".tokens")) paintTokens();
})();
