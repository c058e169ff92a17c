// The Playground page (book/playground.md): the form, the URL fragment, the worker, the results.
// The Python (phantom.playground) runs in worker.mjs; this file only moves text between the form, the
// address and the worker, and draws what Python returns. A run that has not answered after
// LIMIT_MS (the reader's endless loop) gets the worker terminated and a new one started.
// window.PHANTOM_PLAYGROUND = {presets: {name: {title, fields}}, default, fields, limit_s} is written
// into the page by the book's Sphinx extension from phantom.playground.PRESETS.
(function () {
  "use strict";
  const base = new URL(".", document.currentScript.src);
  const config = window.PHANTOM_PLAYGROUND;
  const LIMIT_MS = 1000 * config.limit_s;
  const MAX_ROWS = 300;
  const COLORS = { pass: "#0072B2", fail: "#D55E00" };  // the book's outcome / no-filter colours
  const state = { worker: null, ready: false, inflight: null, pending: false, id: 0, stopped: "", debounce: null,
                  problem: "" };
  // what the browser test and benchmarks/bench_playground.py read (ms since the navigation started)
  const timings = window.phantomPlayground = { loadMs: null, firstResultMs: null, version: null, restarts: 0,
                                               renders: 0 };
  let el = {};
  // the worker starts as soon as this script runs (in the page's head), not when the document is
  // parsed: Pyodide's start-up is most of the wait, and plotly.js alone takes a while to parse
  const domReady = new Promise((resolve) => {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", resolve);
    else resolve();
  });

  function fmt(x, digits) {
    if (Math.abs(x) < 0.5 * Math.pow(10, -digits)) return (0).toFixed(digits);
    const s = Math.abs(x).toFixed(digits);
    return x < 0 ? "\u2212" + s : s;
  }
  function setStatus(kind, text) {
    el.status.dataset.state = kind;
    el.status.textContent = text;
  }
  function readForm() {
    const out = {};
    for (const name of config.fields) out[name] = el.form.elements[name].value;
    return out;
  }
  function fillForm(fields) {
    for (const name of config.fields) {
      if (name in fields) el.form.elements[name].value = fields[name];
    }
    syncPreset();
  }
  function syncPreset() {
    const now = readForm();
    const match = Object.keys(config.presets).find(
      (n) => config.fields.every((f) => config.presets[n].fields[f] === now[f]));
    el.preset.value = match || "";
  }
  function fromFragment() {
    const params = new URLSearchParams(window.location.hash.replace(/^#/, ""));
    let name = params.get("preset") || config.default;
    const problems = [];
    if (!(name in config.presets)) {
      problems.push(`preset ${JSON.stringify(name)} is unknown; allowed: ${Object.keys(config.presets).join(", ")}`);
      name = config.default;
    }
    const fields = Object.assign({}, config.presets[name].fields);
    for (const f of config.fields) {
      if (!params.has(f)) continue;
      const input = el.form.elements[f];
      const allowed = input.tagName === "SELECT" ? Array.from(input.options, (o) => o.value) : null;
      if (allowed && !allowed.includes(params.get(f))) {
        problems.push(`${f} ${JSON.stringify(params.get(f))} is unknown; allowed: ${allowed.join(", ")}`);
      } else {
        fields[f] = params.get(f);
      }
    }
    const problem = problems.length ? `In the address: ${problems.join("; ")}.` : "";
    return { fields, problem };
  }
  function shareLink(fields) {
    return window.location.pathname + "#" + new URLSearchParams(fields).toString();
  }

  // ---------------------------------------------------------------- the worker
  function startWorker() {
    state.ready = false;
    let worker;
    try {
      worker = new Worker(new URL("worker.mjs", base), { type: "module" });
    } catch (err) {
      domReady.then(() => setStatus("fatal", `This browser cannot start the page's Python worker: ${err.message}`));
      return;
    }
    state.worker = worker;
    worker.onmessage = (event) => domReady.then(() => onMessage(worker, event.data));
    worker.onerror = (event) => domReady.then(() => {
      if (worker === state.worker) setStatus("fatal", `Python could not start: ${event.message || "the worker failed to load"}`);
    });
  }
  function onMessage(worker, msg) {
    if (worker !== state.worker) return;  // a terminated worker's late message
    if (msg.type === "fatal") {
      setStatus("fatal", `Python could not start: ${msg.message}`);
    } else if (msg.type === "ready") {
      state.ready = true;
      if (timings.loadMs === null) timings.loadMs = performance.now();
      timings.version = msg.version;
      if (state.stopped) {
        setStatus("stopped", `${state.stopped} Python ${msg.version} restarted in ${msg.seconds.toFixed(1)} s; ` +
                  "edit the inputs to run again.");
      } else {
        setStatus("ready", `Python ${msg.version} is ready (loaded in ${msg.seconds.toFixed(1)} s).`);
      }
      if (state.pending) run();
    } else if (msg.type === "result" && state.inflight && msg.id === state.inflight.id) {
      clearTimeout(state.inflight.timer);
      state.inflight = null;
      state.stopped = "";
      render(msg.result, msg.printed);
      if (msg.fatal) restart(`${msg.result.error} Its worker was terminated.`);
      else if (state.pending) run();
    }
  }
  function restart(why) {
    state.worker.terminate();
    state.inflight = null;
    state.pending = false;
    timings.restarts += 1;
    state.stopped = why;
    el.codeError.textContent = why;
    el.results.classList.add("pg-stale");
    setStatus("stopped", `${why} Restarting Python\u2026`);
    startWorker();
  }
  function stop() {
    restart(`Stopped: the run did not finish within ${config.limit_s} s (an endless loop in reward?), ` +
            "so its worker was terminated.");
  }
  function run() {
    const fields = readForm();
    el.share.href = shareLink(fields);
    if (!state.ready || state.inflight) {
      state.pending = true;
      return;
    }
    state.pending = false;
    state.id += 1;
    state.inflight = { id: state.id, timer: setTimeout(stop, LIMIT_MS) };
    setStatus("running", "Running\u2026");
    state.worker.postMessage({ id: state.id, fields });
  }
  function schedule() {
    clearTimeout(state.debounce);
    state.problem = "";
    syncPreset();
    state.debounce = setTimeout(run, 350);
  }

  // ---------------------------------------------------------------- results
  function render(res, printed) {
    timings.renders += 1;
    el.printed.textContent = printed ? `printed:\n${printed}` : "";
    for (const input of el.form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
    el.codeError.textContent = "";
    el.fieldError.textContent = state.problem;  // a bad value in the address, until the reader edits
    if (!res.ok) {
      (res.field === "code" ? el.codeError : el.fieldError).textContent = res.error;
      const input = el.form.elements[res.field];
      if (input) input.setAttribute("aria-invalid", "true");
      el.results.classList.add("pg-stale");
      setStatus("error", `Not computed: ${res.error}`);
      return;
    }
    el.results.classList.remove("pg-stale");
    drawTable(res);
    drawSummary(res);
    drawChart(res);
    if (timings.firstResultMs === null) timings.firstResultMs = performance.now();
    const b = res.batch;
    setStatus("done", `Computed ${b.answers} advantage${b.answers === 1 ? "" : "s"} in ${b.groups} ` +
              `group${b.groups === 1 ? "" : "s"} with Python ${timings.version}.`);
  }
  function cell(row, text, cls, attrs) {
    const td = document.createElement(row.parentNode && row.parentNode.tagName === "THEAD" ? "th" : "td");
    td.textContent = text;
    if (cls) td.className = cls;
    for (const [k, v] of Object.entries(attrs || {})) td.setAttribute(k, v);
    row.appendChild(td);
  }
  function drawTable(res) {
    const table = el.table;
    table.textContent = "";
    const head = table.createTHead().insertRow();
    for (const h of ["group", "answer", "outcome", "length", "reward", "advantage"]) cell(head, h);
    const body = table.createTBody();
    let shown = 0;
    res.groups.forEach((g, gi) => g.advantages.forEach((a, ai) => {
      if (shown++ >= MAX_ROWS) return;
      const row = body.insertRow();
      row.className = g.zeroed ? "pg-zeroed" : "";
      cell(row, String(gi + 1));
      cell(row, String(ai + 1));
      cell(row, g.outcomes[ai] ? "1 (right)" : "0 (wrong)");
      cell(row, String(g.lengths[ai]));
      cell(row, fmt(g.rewards[ai], 4), "pg-num", { "data-reward": String(g.rewards[ai]) });
      cell(row, fmt(a, 2), "pg-num pg-adv", { "data-adv": String(a) });
    }));
    const total = res.batch.answers;
    const caption = table.createCaption();
    caption.textContent = `Each answer's reward and advantage` +
      (total > MAX_ROWS ? ` (the first ${MAX_ROWS} of ${total} answers)` : "") +
      "; rows of a group the gate zeroed are greyed.";
  }
  function pct(k, n) { return `${k} (${Math.round(100 * k / n)}%)`; }
  function drawSummary(res) {
    const b = res.batch;
    const lines = [];
    const describe = (g) => {
      const n = g.outcomes.length;
      const passed = g.outcomes.filter((o) => o).length;
      let kind = g.all_fail ? `all ${n} answers failed` : g.all_pass ? `all ${n} answers passed` :
        `${passed} of ${n} answers passed`;
      if (g.single) kind = "a single answer";
      let phantom = "";
      if (g.phantom) {
        phantom = g.zeroed ? " A phantom group (no outcome contrast, rewards still spread), but the gate dropped it." :
          " A phantom group: no outcome contrast, yet its rewards spread" +
          (res.fields.est === "grpo" ? ", and GRPO scales them to full-size advantages." : " (Dr. GRPO keeps them at reward scale).");
      }
      return `${kind}; ${g.verdict}.${phantom}`;
    };
    if (res.groups.length === 1) {
      lines.push(["pg-group", `This group: ${describe(res.groups[0])}`]);
    } else {
      lines.push(["pg-batch", `Batch: ${b.groups} groups, ${b.answers} answers; all-fail ${pct(b.all_fail, b.groups)}, ` +
        `phantom ${pct(b.phantom, b.groups)}, zeroed by the gate ${pct(b.zeroed, b.groups)}; ` +
        `phantoms left live: ${pct(b.phantom_live, b.groups)}.`]);
      res.groups.slice(0, 30).forEach((g, i) => lines.push(["pg-group", `Group ${i + 1}: ${describe(g)}`]));
      if (res.groups.length > 30) lines.push(["pg-group", `(and ${res.groups.length - 30} more groups)`]);
    }
    el.summary.textContent = "";
    for (const [cls, text] of lines) {
      const p = document.createElement("p");
      p.className = cls;
      p.textContent = text;
      el.summary.appendChild(p);
    }
  }
  function drawChart(res) {
    if (!window.Plotly) return;
    const single = res.groups.length === 1;
    const x = [], y = [], color = [], text = [];
    res.groups.slice(0, 60).forEach((g, gi) => g.advantages.forEach((a, ai) => {
      x.push(single ? `#${ai + 1} \u00b7 ${g.lengths[ai]}` : `g${gi + 1}\u00b7${ai + 1}`);
      y.push(a);
      color.push(g.outcomes[ai] ? COLORS.pass : COLORS.fail);
      text.push(`outcome ${g.outcomes[ai]}, length ${g.lengths[ai]}, reward ${fmt(g.rewards[ai], 4)}`);
    }));
    const est = res.fields.est === "grpo" ? "GRPO" : "Dr. GRPO";
    const trace = { type: "bar", x, y, marker: { color }, text, textposition: "none", hovertemplate: "%{text}<br>advantage %{y:.3f}<extra></extra>" };
    const layout = {
      title: { text: `Advantages: ${est}, gate ${res.fields.gate}, \u03bb = ${res.fields.lam}` },
      xaxis: { title: { text: single ? "answer \u00b7 length (characters)" : "group \u00b7 answer" }, type: "category" },
      yaxis: { title: { text: res.fields.est === "grpo" ? "advantage (group std units)" : "advantage (reward units)" },
               zeroline: true },
      height: 380, margin: { t: 50, r: 20, b: 60, l: 70 }, template: undefined,
      plot_bgcolor: "white", paper_bgcolor: "white", font: { family: "Helvetica, Arial, sans-serif", size: 13 },
    };
    window.Plotly.react(el.chart, [trace], layout, { displaylogo: false, responsive: true });
  }

  // ---------------------------------------------------------------- wiring
  function init() {
    const root = document.getElementById("phantom-playground");
    if (!root) return;
    el = {
      root, form: document.getElementById("pg-form"), status: document.getElementById("pg-status"),
      preset: document.getElementById("pg-preset"), share: document.getElementById("pg-share"),
      codeError: document.getElementById("pg-code-error"), fieldError: document.getElementById("pg-field-error"),
      printed: document.getElementById("pg-printed"), table: document.getElementById("pg-table"),
      summary: document.getElementById("pg-summary"), chart: document.getElementById("pg-chart"),
    };
    el.results = root;
    const own = document.createElement("option");
    own.value = "";
    own.textContent = "your own inputs";
    el.preset.appendChild(own);
    for (const [name, p] of Object.entries(config.presets)) {
      const opt = document.createElement("option");
      opt.value = name;
      opt.textContent = p.title;
      el.preset.appendChild(opt);
    }
    const applyFragment = () => {
      const { fields, problem } = fromFragment();
      fillForm(fields);
      state.problem = problem;
      el.fieldError.textContent = problem;
      el.share.href = shareLink(readForm());
    };
    applyFragment();
    el.form.addEventListener("input", (event) => { if (event.target !== el.preset) schedule(); });
    el.preset.addEventListener("change", () => {
      if (!el.preset.value) return;
      history.replaceState(null, "", "#preset=" + el.preset.value);
      applyFragment();
      run();
    });
    window.addEventListener("hashchange", () => { applyFragment(); run(); });
    document.getElementById("pg-run").addEventListener("click", run);
    el.form.elements.code.addEventListener("keydown", (event) => {
      if (event.key !== "Tab" || event.shiftKey) return;
      event.preventDefault();
      document.execCommand("insertText", false, "    ");
    });
    if (window.location.protocol === "file:") {
      setStatus("fatal", "This page runs Python from WebAssembly, which browsers do not load from file:// pages. " +
                "Serve the built book instead: python -m http.server 8000 -d _build/html, then open " +
                "http://127.0.0.1:8000/book/playground.html");
    } else if (!state.worker) {
      setStatus("fatal", "This browser has no module Web Workers, which the page's Python runs in.");
    }
  }
  state.pending = true;  // the first run waits for Python
  if (window.location.protocol !== "file:" && typeof Worker !== "undefined") startWorker();
  domReady.then(init);
})();
