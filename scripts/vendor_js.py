#!/usr/bin/env python3
"""Put every JavaScript library the built book loads into book/_static/vendor/, so no page asks a CDN.

* plotly.min.js is copied from the installed plotly wheel, so it always matches plotly.py;
* require.js, @jupyter-widgets/html-manager (the static ipywidgets renderer), MathJax 3 and Pyodide
  (CPython in WebAssembly with its standard library, for the Playground page) come from the npm
  registry through `npm pack` (the tarball only, no dependency tree, no node_modules), and each
  tarball is checked against the sha512 integrity pinned below before anything is unpacked.
  Pyodide's files are never committed and never loaded from its CDN: the page's worker loads them
  from `_static/vendor/pyodide/`.

Idempotent: when vendor/VERSIONS.json matches what would be vendored and every file is present it
returns at once. `--check` only verifies (exit 1 when something is missing).

usage: python scripts/vendor_js.py [--check] [--force]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "book" / "_static" / "vendor"

#: npm package -> (version, sha512 integrity of the tarball as the registry publishes it)
NPM = {
    "requirejs": ("2.3.8", "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw=="),
    "@jupyter-widgets/html-manager": (
        "1.0.15", "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA=="),
    "mathjax": ("3.2.2", "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="),
    "pyodide": ("314.0.7", "sha512-0YvXxEhfEdpLfb/XkM2BFAeMROq0iMUX2bzzH9pOttyMcWkwq+HbE5uyuGD82LN7y2q+SNvi/6V5JEsOlD2R1A=="),
}
#: the Pyodide files the Playground's worker loads: the ES-module loader, the interpreter (JS glue and
#: wasm), the standard library and the lock file `loadPyodide` reads (it loads no package from it).
#: Left out: the source maps, the TypeScript declarations and the two console demo pages.
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
#: files the book's _config.yml points at; all must exist after vendoring
REQUIRED = ("plotly.min.js", "require.js", "html-manager/embed-amd.js", "mathjax/tex-mml-chtml.js",
            *(f"pyodide/{f}" for f in PYODIDE_FILES))
FONT_SUFFIXES = (".woff", ".woff2", ".ttf", ".eot", ".svg")


def plotly_js() -> tuple[Path, str]:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise SystemExit(f"vendor_js: {path} is missing from the installed plotly wheel")
    return path, plotly.__version__


def wanted_versions() -> dict[str, str]:
    _, plotly_version = plotly_js()
    return {"plotly.py": plotly_version, **{name: v for name, (v, _) in NPM.items()}}


def up_to_date() -> bool:
    stamp = VENDOR / "VERSIONS.json"
    try:
        have = json.loads(stamp.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return have == wanted_versions() and all((VENDOR / f).is_file() for f in REQUIRED)


def _integrity(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def _safe_extract(tgz: Path, dest: Path) -> Path:
    """Unpack a tarball refusing absolute paths, '..' and links (a tarball is untrusted input)."""
    with tarfile.open(tgz) as tar:
        for member in tar.getmembers():
            target = (dest / member.name).resolve()
            if not str(target).startswith(str(dest.resolve()) + os.sep) or member.issym() or member.islnk():
                raise SystemExit(f"vendor_js: refusing unsafe path {member.name!r} in {tgz.name}")
        tar.extractall(dest)  # noqa: S202 -- members checked above
    return dest / "package"


def npm_pack(name: str, version: str, integrity: str, workdir: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("vendor_js: npm is not on PATH (Node 20 + npm are needed to vendor MathJax, require.js and Pyodide)")
    proc = subprocess.run([npm, "pack", "--json", "--silent", "--prefer-offline", f"{name}@{version}"],
                          cwd=workdir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vendor_js: npm pack {name}@{version} failed:\n{proc.stderr[-2000:]}")
    info = json.loads(proc.stdout)[0]
    tgz = workdir / info["filename"]
    got = _integrity(tgz)
    if got != integrity:
        raise SystemExit(f"vendor_js: {name}@{version} integrity mismatch: got {got}, pinned {integrity}")
    out = workdir / info["filename"].removesuffix(".tgz")
    out.mkdir()
    return _safe_extract(tgz, out)


def vendor() -> None:
    tmp_vendor = VENDOR.with_name(".vendor.tmp")
    shutil.rmtree(tmp_vendor, ignore_errors=True)
    tmp_vendor.mkdir(parents=True)
    src, _ = plotly_js()
    shutil.copyfile(src, tmp_vendor / "plotly.min.js")
    with tempfile.TemporaryDirectory(prefix="phantom-vendor-") as td:
        work = Path(td)
        pkgs = {name: npm_pack(name, v, integ, work) for name, (v, integ) in NPM.items()}
        shutil.copyfile(pkgs["requirejs"] / "require.js", tmp_vendor / "require.js")
        hm, dist = tmp_vendor / "html-manager", pkgs["@jupyter-widgets/html-manager"] / "dist"
        hm.mkdir()
        shutil.copyfile(dist / "embed-amd.js", hm / "embed-amd.js")
        for f in dist.iterdir():
            if f.suffix in FONT_SUFFIXES:  # fonts the widget CSS refers to by hashed name
                shutil.copyfile(f, hm / f.name)
        es5, mj = pkgs["mathjax"] / "es5", tmp_vendor / "mathjax"
        mj.mkdir()
        shutil.copyfile(es5 / "tex-mml-chtml.js", mj / "tex-mml-chtml.js")
        shutil.copytree(es5 / "output" / "chtml" / "fonts", mj / "output" / "chtml" / "fonts")
        shutil.copytree(es5 / "input" / "tex" / "extensions", mj / "input" / "tex" / "extensions")
        (tmp_vendor / "pyodide").mkdir()
        for f in PYODIDE_FILES:
            shutil.copyfile(pkgs["pyodide"] / f, tmp_vendor / "pyodide" / f)
    (tmp_vendor / "VERSIONS.json").write_text(json.dumps(wanted_versions(), indent=2, sort_keys=True) + "\n")
    missing = [f for f in REQUIRED if not (tmp_vendor / f).is_file()]
    if missing:
        raise SystemExit(f"vendor_js: missing after vendoring: {', '.join(missing)}")
    shutil.rmtree(VENDOR, ignore_errors=True)
    os.replace(tmp_vendor, VENDOR)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only verify; exit 1 when out of date")
    ap.add_argument("--force", action="store_true", help="vendor again even when up to date")
    args = ap.parse_args(argv)
    if not args.force and up_to_date():
        print(f"vendor_js: {VENDOR.relative_to(ROOT)} is up to date")
        return 0
    if args.check:
        print(f"vendor_js: {VENDOR.relative_to(ROOT)} is missing or out of date; run scripts/vendor_js.py")
        return 1
    vendor()
    size = sum(p.stat().st_size for p in VENDOR.rglob("*") if p.is_file())
    print(f"vendor_js: vendored {', '.join(f'{k} {v}' for k, v in wanted_versions().items())} "
          f"into {VENDOR.relative_to(ROOT)} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
