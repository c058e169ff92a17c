// The Playground's Python: Pyodide (CPython in WebAssembly) in a module Web Worker, so the reader's
// reward function can never freeze the page; the page terminates this worker when a run takes too
// long and starts a new one. Everything is loaded from the book's own _static folder: Pyodide from
// vendor/pyodide/ (scripts/vendor_js.py puts it there at build time), the package's
// phantom/playground.py from next to this file (the book's Sphinx extension copies it there).
// Protocol: -> {id, fields}; <- {type: "ready", seconds, version} | {type: "fatal", message}
//           | {type: "result", id, result, printed, fatal} (fatal: the interpreter broke; start a new worker).

const here = new URL(".", import.meta.url);
const indexURL = new URL("../vendor/pyodide/", import.meta.url).href;
let printed = [];

async function start() {
  const t0 = performance.now();
  const { loadPyodide } = await import(new URL("pyodide.mjs", indexURL).href);
  // packageBaseUrl: no package is ever loaded, but point even that at the local copy, never a CDN
  const py = await loadPyodide({ indexURL, packageBaseUrl: indexURL,
    stdout: (line) => printed.push(line), stderr: (line) => printed.push(line) });
  const response = await fetch(new URL("phantom/playground.py", here));
  if (!response.ok) throw new Error(`phantom/playground.py: HTTP ${response.status}`);
  const source = await response.text();
  py.FS.mkdirTree("/home/pyodide/phantom");
  py.FS.writeFile("/home/pyodide/phantom/__init__.py", "");
  py.FS.writeFile("/home/pyodide/phantom/playground.py", source);
  const run = py.runPython(
    "import json, sys\n" +
    "sys.path.insert(0, '/home/pyodide')\n" +
    "import phantom.playground as pg\n" +
    "lambda text: json.dumps(pg.run(json.loads(text)), allow_nan=False)\n");
  const version = py.runPython("import sys; sys.version.split()[0]");
  return { run, version, seconds: (performance.now() - t0) / 1000 };
}

const ready = start();
ready.then(
  (p) => postMessage({ type: "ready", seconds: p.seconds, version: p.version }),
  (err) => postMessage({ type: "fatal", message: String(err && err.message || err) }),
);

onmessage = async (event) => {
  const { id, fields } = event.data;
  let p;
  try {
    p = await ready;
  } catch (err) {
    return;  // already reported as fatal
  }
  printed = [];
  let result;
  let fatal = false;
  try {
    result = JSON.parse(p.run(JSON.stringify(fields)));
  } catch (err) {
    // phantom.playground.run catches every error of the reader's code; what reaches here broke the
    // interpreter itself (a blown wasm stack after sys.setrecursionlimit, memory): restart it
    fatal = true;
    const first = String(err && err.message || err).trim().split("\n").pop();
    result = { ok: false, field: "code", error: `Python itself failed (${first}).` };
  }
  postMessage({ type: "result", id, result, fatal, printed: printed.join("\n").slice(0, 4000) });
};
