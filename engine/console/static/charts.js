// The console's drawings: a hit's explain breakdown (HTML bars), the load chart and the
// evaluation charts (Chart.js, shipped in vendor/). Also loaded by `polyindex eval --plot`'s
// HTML file, so the CLI and the console draw the same charts.
"use strict";
const PICharts = (() => {
  const h = (tag, attrs, ...kids) => {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") n.className = v; else if (k === "style") n.style.cssText = v;
      else n.setAttribute(k, v);
    }
    for (const c of kids.flat()) if (c !== null && c !== undefined)
      n.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return n;
  };
  const f4 = x => (x === null || x === undefined) ? "–" : Number(x).toFixed(4);
  const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
                  "#ff9da7", "#9c755f", "#bab0ac"];

  // One hit's account: each retrieve stage's rank and score (bar: the score against the
  // best score of that stage among the shown hits), the fusion, and the ranker's top
  // feature contributions (signed bars).
  function explain(hit, stageMax, top = 6) {
    const ex = hit.explain || {};
    const stages = ex.stages || {};
    // in name order: the explain comes as a protobuf Struct, whose keys have no order
    const rows = Object.entries(stages).sort(([a], [b]) => a < b ? -1 : 1).map(([name, st]) => {
      const w = st && stageMax[name] ? Math.max(2, 100 * Math.abs(st.score) / stageMax[name]) : 0;
      return h("tr", {"data-stage": name},
        h("td", {}, name), h("td", {class: "num"}, st ? st.rank : "not retrieved"),
        h("td", {class: "num"}, st ? f4(st.score) : "–"),
        h("td", {class: "bar-cell"}, st ? h("div", {class: "bar", style: `width:${w}%`}) : null));
    });
    const fused = ex.fused || {};
    rows.push(h("tr", {"data-fusion": fused.method || "none"},
      h("td", {}, "fusion" + (fused.method ? ` (${fused.method})` : "")),
      h("td", {class: "num"}, "rank " + hit.rank), h("td", {class: "num"}, f4(fused.score)),
      h("td", {})));
    const stageTable = h("table", {class: "stages"},
      h("tr", {}, h("th", {}, "stage"), h("th", {class: "num"}, "rank"),
        h("th", {class: "num"}, "score"), h("th", {}, "")), rows);
    let rerank = h("div", {class: "muted"}, "no rerank stage");
    if (ex.rerank) {
      const c = Object.entries(ex.rerank.contributions || {}).filter(([n]) => n !== "bias")
        .sort((a, b) => Math.abs(b[1]) - Math.abs(a[1])).slice(0, top);
      const m = Math.max(1e-9, ...c.map(([, v]) => Math.abs(v)));
      rerank = h("table", {class: "rerank"},
        h("tr", {}, h("th", {}, `ranker: model score ${f4(ex.rerank.model_score)}`),
          h("th", {class: "num"}, "contribution"), h("th", {class: "bar-cell"}, "")),
        c.map(([name, v]) => {
          const w = `width:${Math.max(2, 100 * Math.abs(v) / m)}%`;
          return h("tr", {"data-feature": name}, h("td", {}, name), h("td", {class: "num"}, f4(v)),
            h("td", {class: "bar-cell"}, h("div", {class: "contrib"},
              h("div", {class: "half left"}, v < 0 ? h("div", {class: "bar neg", style: w}) : null),
              h("div", {class: "half"}, v >= 0 ? h("div", {class: "bar pos", style: w}) : null))));
        }));
    }
    return h("div", {class: "explain"}, stageTable, rerank);
  }

  function stageMaxima(hits) {
    const m = {};
    for (const hit of hits) for (const [name, st] of Object.entries((hit.explain || {}).stages || {}))
      if (st) m[name] = Math.max(m[name] || 0, Math.abs(st.score));
    return m;
  }

  // the load chart; called again with `chart`, it updates that chart in place
  function load(canvas, series, chart) {
    const pts = series.points || [];
    const labels = pts.map(p => new Date(p.t * 1000).toLocaleTimeString());
    const datasets = [{label: "queries/s", data: pts.map(p => p.qps), yAxisID: "y",
                       borderColor: COLORS[0], backgroundColor: COLORS[0], tension: 0.2}];
    if (series.latency) datasets.push({label: "mean latency (ms)", data: pts.map(p => p.latency_ms),
      yAxisID: "y2", borderColor: COLORS[1], backgroundColor: COLORS[1], tension: 0.2, spanGaps: true});
    if (chart) {
      chart.data.labels = labels;
      datasets.forEach((d, i) => { chart.data.datasets[i].data = d.data; });
      chart.update();
      return chart;
    }
    return new Chart(canvas, {type: "line", data: {labels, datasets}, options: {
      animation: false, maintainAspectRatio: false,
      scales: {y: {beginAtZero: true, title: {display: true, text: "q/s"}},
               y2: {beginAtZero: true, position: "right", display: !!series.latency,
                    grid: {drawOnChartArea: false}, title: {display: true, text: "ms"}}}}});
  }

  // whiskers from each bar's dataset.ci[i] = [low, high]
  const errorBars = {id: "piErrorBars", afterDatasetsDraw(chart) {
    const {ctx, scales: {y}} = chart;
    ctx.save(); ctx.strokeStyle = "#222"; ctx.lineWidth = 1.2;
    chart.data.datasets.forEach((ds, i) => {
      if (!ds.ci || !chart.isDatasetVisible(i)) return;
      chart.getDatasetMeta(i).data.forEach((bar, j) => {
        const [lo, hi] = ds.ci[j]; const x = bar.x, a = y.getPixelForValue(lo), b = y.getPixelForValue(hi);
        ctx.beginPath(); ctx.moveTo(x, a); ctx.lineTo(x, b);
        ctx.moveTo(x - 4, a); ctx.lineTo(x + 4, a); ctx.moveTo(x - 4, b); ctx.lineTo(x + 4, b);
        ctx.stroke();
      });
    });
    ctx.restore();
  }};

  // summary: cli.evaluate.summarize's JSON. Draws into `box`: means with confidence
  // intervals, wins/ties/losses against the baseline, per-query differences.
  function evaluation(box, s) {
    const charts = [];
    const card = (id, title) => {
      const canvas = h("canvas", {id});
      box.append(h("div", {class: "chart", "data-chart": id}, h("div", {}, h("b", {}, title)),
        h("div", {style: "position:relative;height:280px"}, canvas)));
      return canvas;
    };
    const pct = Math.round(100 * s.confidence);
    charts.push(new Chart(card("eval-means", `Each measure per profile (${s.queries} queries, ` +
      `${pct}% confidence intervals)`), {type: "bar", plugins: [errorBars], data: {
        labels: s.measures, datasets: s.profiles.map((p, i) => ({label: p,
          backgroundColor: COLORS[i % COLORS.length],
          data: s.measures.map(m => s.means[p][m].mean),
          ci: s.measures.map(m => [s.means[p][m].low, s.means[p][m].high])}))},
      options: {animation: false, maintainAspectRatio: false, scales: {y: {beginAtZero: true}}}}));
    const others = s.profiles.slice(1);
    if (others.length) {
      const labels = others.flatMap(p => s.measures.map(m => `${p} · ${m}`));
      const part = key => others.flatMap(p => s.measures.map(m => s.wins[p][m][key]));
      charts.push(new Chart(card("eval-wins", `Per-query wins, ties and losses against ${s.baseline}`),
        {type: "bar", data: {labels, datasets: [
          {label: "wins", data: part("wins"), backgroundColor: "#59a14f"},
          {label: "ties", data: part("ties"), backgroundColor: "#bab0ac"},
          {label: "losses", data: part("losses"), backgroundColor: "#e15759"}]},
         options: {indexAxis: "y", animation: false, maintainAspectRatio: false,
                   scales: {x: {stacked: true}, y: {stacked: true}}}}));
      const first = s.measures[0];
      const n = Math.max(...others.map(p => (s.deltas[p] || []).length));
      charts.push(new Chart(card("eval-deltas", `${first} per query minus ${s.baseline}'s ` +
        "(sorted, largest gain first)"), {type: "bar", data: {
          labels: Array.from({length: n}, (_, i) => i + 1),
          datasets: others.map((p, i) => ({label: p, backgroundColor: COLORS[(i + 1) % COLORS.length],
            data: (s.deltas[p] || []).map(d => d.delta)}))},
         options: {animation: false, maintainAspectRatio: false,
                   plugins: {tooltip: {callbacks: {title: items => items.map(it =>
                     "query " + ((s.deltas[it.dataset.label] || [])[it.dataIndex] || {}).query)}}},
                   scales: {x: {title: {display: true, text: "queries"}}}}}));
    }
    return charts;
  }

  function evalTable(s) {
    return h("table", {class: "eval"},
      h("tr", {}, h("th", {}, "profile"), s.measures.map(m => h("th", {class: "num"}, m)),
        s.profiles.length > 1 ? h("th", {}, `wins/ties/losses vs ${s.baseline} (${s.measures[0]})`) : null),
      s.profiles.map(p => h("tr", {"data-profile": p}, h("td", {}, p),
        s.measures.map(m => { const v = s.means[p][m];
          return h("td", {class: "num"}, `${f4(v.mean)} [${f4(v.low)}, ${f4(v.high)}]`); }),
        s.profiles.length > 1 ? h("td", {}, p === s.baseline ? "baseline" : (w =>
          `${w.wins} / ${w.ties} / ${w.losses}`)(s.wins[p][s.measures[0]])) : null)));
  }

  return {explain, stageMaxima, load, evaluation, evalTable};
})();
