"""``phantom watch METRICS.jsonl``: follow a run's leading indicators while it trains.

The paper's second rule: dashboard the all-fail fraction (the dose) and the mean response length,
because in collapsing runs length moves *before* validation accuracy. This follows a verl (or
lab) ``metrics.jsonl`` as it grows - a torn last line, a file that does not exist yet, and verl's
truncate-on-restart are all handled - and redraws a plain ANSI table of all-fail fraction,
phantom groups, mean response length, validation accuracy and refill counts. It warns when the
length (training batch, smoothed, or held-out) has fallen by ``--length-drop`` (default 20%) while
held-out accuracy has not yet fallen by ``--acc-drop`` (default 0.10, absolute): the thresholds and
step rules of :mod:`phantom.dynamics`, so the watch and the book's dynamics tables read one order.
``--once`` prints the table and exits (CI, notebooks): exit 1 when a warning fired, 2 when the
file cannot be read, else 0.

It never reports "all clear" on nothing: no complete record, records without a ``data`` mapping, none
of the known metric keys, a ``--val-key`` that matches no validation key, or a file that never appeared
within ``--timeout``, are each named and exit 2. A run folder's status (``manifest.json``: running,
done, failed, interrupted) is shown in the table's first line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phantom.cli import exit_code_of as _exit_code
from phantom.dynamics import ACC_DROP, LENGTH_DROP, first_fall

__all__ = ["Alert", "MetricsTail", "detect", "indicators", "main", "render"]

VAL_ACC = re.compile(r"^val-core/(?P<ds>.+)/acc/mean@(?P<n>\d+)$")
VAL_REWARD = re.compile(r"^val-core/(?P<ds>.+)/reward/mean@(?P<n>\d+)$")
#: column -> candidate metric keys (first present wins); ARCHITECTURE.md's table
COLUMNS: dict[str, tuple[str, ...]] = {
    "all_fail": ("phantom/frac/all_fail",),
    "phantom": ("phantom/groups/phantom",),
    "dead_live": ("phantom/groups/degenerate_live",),
    "live": ("phantom/frac/live",),
    "length": ("response_length/mean",),
    "score": ("critic/score/mean",),
    "abs_adv": ("phantom/adv/abs_mean",),
    "acc": ("phantom/acc/mean",),
    "refill": ("phantom/gen_batches", "train/num_gen_batches", "training/filter_groups/evicted_samples"),
}
HEADERS = {"step": "step", "all_fail": "all-fail", "phantom": "phantom", "dead_live": "dead kept", "live": "live", "length": "len",
           "val_acc": "val acc", "val_len": "val len", "score": "score", "abs_adv": "|A|", "acc": "train acc", "refill": "refill"}


class MetricsTail:
    """Incremental reader of a growing ``{"step": n, "data": {...}}`` JSONL file."""

    def __init__(self, path: str | os.PathLike[str]):
        p = Path(path)
        self.path = p / "metrics.jsonl" if p.is_dir() else p
        self.rows: dict[int, dict[str, Any]] = {}
        self.bad_lines = 0
        self.flat = 0  # records whose "data" is missing or not a mapping (metrics at the top level?)
        self._offset, self._buf, self._ino = 0, b"", None

    def poll(self) -> bool:
        """Read what was appended since the last call; True when new complete records arrived."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return False
        if st.st_ino != self._ino or st.st_size < self._offset:  # new file, or verl truncated it on restart
            self.rows.clear()
            self._offset, self._buf, self._ino, self.bad_lines, self.flat = 0, b"", st.st_ino, 0, 0
        if st.st_size == self._offset:
            return False
        with self.path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        self._offset += len(data)
        self._buf += data
        *complete, self._buf = self._buf.split(b"\n")
        return sum(self._take(line) for line in complete) > 0

    def _take(self, line: bytes) -> bool:
        if not line.strip():
            return False
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.bad_lines += 1
            return False
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), (int, float)):
            self.bad_lines += 1
            return False
        data = rec.get("data")
        if not isinstance(data, dict):
            self.flat += 1
            data = {}
        self.rows.setdefault(int(rec["step"]), {}).update(data)
        return True

    @property
    def torn(self) -> bool:
        """A partial last line is waiting for its end (the writer is mid-line, or died there)."""
        return bool(self._buf.strip())


@dataclass
class Alert:
    kind: str  # "length" | "accuracy" | "phantom"
    step: int
    severity: str  # "warning" | "info"
    message: str


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _val_key(rows: dict[int, dict], pattern: re.Pattern[str], want: str | None) -> str | None:
    keys = sorted({k for r in rows.values() for k in r if pattern.match(k)})
    if want is not None:
        return next((k for k in keys if want in k), None)
    return keys[0] if keys else None


def indicators(rows: dict[int, dict[str, Any]], *, val_key: str | None = None) -> tuple[list[dict], dict[str, str]]:
    """One dict per step with the leading indicators, and the metric key behind each column."""
    acc_key = _val_key(rows, VAL_ACC, val_key) or _val_key(rows, VAL_REWARD, val_key)
    source: dict[str, str] = {}
    if acc_key:
        source["val_acc"] = acc_key
        ds = (VAL_ACC.match(acc_key) or VAL_REWARD.match(acc_key)).group("ds")
        len_keys = sorted(k for r in rows.values() for k in r if k.startswith(f"val-aux/{ds}/len_chars/mean@"))
        if len_keys:
            source["val_len"] = len_keys[0]
    for col, cands in COLUMNS.items():
        key = next((c for c in cands if any(c in r for r in rows.values())), None)
        if key:
            source[col] = key
    table = []
    for step in sorted(rows):
        r = rows[step]
        table.append({"step": step, **{col: _num(r.get(key)) for col, key in source.items()}})
    return table, source


def known_keys() -> list[str]:
    """The metric keys the watch reads (a validation key has its data source and sample count in it)."""
    return ["val-core/<data source>/acc/mean@<n>", "val-core/<data source>/reward/mean@<n>",
            *(k for cands in COLUMNS.values() for k in cands)]


def key_problem(tail: MetricsTail, source: dict[str, str], val_key: str | None, *, final: bool) -> str | None:
    """Why the table would read nothing, or None: records without ``data``, none of the known keys, a
    ``--val-key`` matching no validation key. ``final``: the file will not grow (``--once``), so a
    ``--val-key`` on a file without any validation key is wrong too; a live run may still log one."""
    if not tail.rows:
        return None
    if tail.flat and not any(tail.rows.values()):
        return (f"{tail.path}: {tail.flat} record(s) without a \"data\" mapping; allowed: verl's file-logger lines, "
                '{"step": n, "data": {"metric": value, ...}}')
    vals = sorted({k for r in tail.rows.values() for k in r if VAL_ACC.match(k) or VAL_REWARD.match(k)})
    if val_key is not None and "val_acc" not in source and (vals or final):
        return (f"--val-key {val_key!r} matches none of the validation keys; allowed: a part of one of "
                f"{', '.join(vals) if vals else '(none in this file)'}")
    if not source:
        found = sorted({k for r in tail.rows.values() for k in r})
        more = f" (and {len(found) - 8} more)" if len(found) > 8 else ""
        return (f"{tail.path}: none of the known metric keys in {len(tail.rows)} step(s); found: "
                f"{', '.join(found[:8]) or 'nothing'}{more}; allowed: {', '.join(known_keys())}")
    return None


def run_status(metrics: Path) -> str | None:
    """The status of the run folder holding ``metrics`` (its ``manifest.json``), e.g. ``running (pid 12)``."""
    try:
        m = json.loads((metrics.parent / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(m, dict) or not isinstance(m.get("status"), str):
        return None
    status = m["status"]
    if status == "running" and m.get("pid"):
        status += f" (pid {m['pid']} on {m.get('host', '?')})"
    elif status in ("failed", "interrupted") and m.get("error"):
        status += f": {str(m['error'])[:120]}"
    return status


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def detect(table: list[dict], *, length_drop: float = LENGTH_DROP, acc_drop: float = ACC_DROP, baseline: int = 3,
           window: int = 3) -> list[Alert]:
    """Alerts: length fell by ``length_drop`` (training length relative to the median of its first
    ``baseline`` points, smoothed over ``window`` points; or held-out length relative to its first
    value, whichever comes first), held-out accuracy fell ``acc_drop`` below its first value
    (absolute, :func:`phantom.dynamics.first_fall`), and phantom groups trained in the latest step."""
    import pandas as pd

    alerts: list[Alert] = []
    lens = [(t["step"], t["length"]) for t in table if t.get("length") is not None]
    accs = [(t["step"], t["val_acc"]) for t in table if t.get("val_acc") is not None]
    vlens = [(t["step"], t["val_len"]) for t in table if t.get("val_len") is not None]
    acc_step = first_fall(pd.Series(dict(accs), dtype=float), drop=acc_drop, relative=False) if accs else None
    acc_at = dict(accs).get(acc_step) if acc_step is not None else None
    found: list[tuple[int, str, float, float]] = []  # (step, which, from, to)
    if len(lens) > baseline:
        l0 = _median([v for _, v in lens[:baseline]])
        for i in range(baseline, len(lens)):
            smooth = _median([v for _, v in lens[max(0, i - window + 1):i + 1]])
            if l0 > 0 and smooth <= l0 * (1 - length_drop):
                found.append((lens[i][0], "training", l0, smooth))
                break
    v_step = first_fall(pd.Series(dict(vlens), dtype=float), drop=length_drop, relative=True) if vlens else None
    if v_step is not None and vlens[0][1] > 0:
        found.append((v_step, "held-out", vlens[0][1], dict(vlens)[v_step]))
    len_step = None
    if found:
        len_step, which, l0, l1 = min(found)
        before = [(s, a) for s, a in accs if s <= len_step]
        if acc_step is None or acc_step > len_step:
            state = (f"validation accuracy has not dropped yet ({before[-1][1]:.3f} at step {before[-1][0]})"
                     if before else "no validation accuracy yet")
            lead = "LEADING INDICATOR: "
        else:
            state, lead = f"validation accuracy already dropped at step {acc_step}", ""
        alerts.append(Alert("length", len_step, "warning",
                            f"{lead}{which} mean response length fell {1 - l1 / l0:.0%} ({l0:.1f} -> {l1:.1f})"
                            f" by step {len_step}; {state}"))
    if acc_step is not None:
        lead = f"; length warned {acc_step - len_step} step(s) earlier" if len_step is not None and \
            len_step < acc_step else ""
        alerts.append(Alert("accuracy", acc_step, "warning",
                            f"validation accuracy fell from {accs[0][1]:.3f} to {acc_at:.3f} by step {acc_step}{lead}"))
    last = next((t for t in reversed(table) if t.get("phantom") is not None), None)
    if last is not None and last["phantom"] and last["phantom"] > 0 and last.get("dead_live") != 0:
        alerts.append(Alert("phantom", last["step"], "info",
                            f"{last['phantom']:.0f} phantom group(s) at step {last['step']}: all-fail, with shaped "
                            "spread; under GRPO without an outcome gate they train at full size"))
    return sorted(alerts, key=lambda a: a.step)


_FMT = {"all_fail": ".3f", "live": ".3f", "val_acc": ".3f", "acc": ".3f", "score": ".3f", "phantom": ".0f",
        "dead_live": ".0f", "abs_adv": ".3f",
        "length": ".1f", "val_len": ".1f", "refill": ".0f"}
_C = {"bold": "\x1b[1m", "red": "\x1b[31m", "yellow": "\x1b[33m", "dim": "\x1b[2m", "reset": "\x1b[0m"}


def render(table: list[dict], source: dict[str, str], alerts: list[Alert], *, path: str = "", rows: int = 15,
           color: bool = False, torn: bool = False, bad_lines: int = 0, status: str | None = None) -> str:
    """The indicator table (last ``rows`` steps) and the alerts, as plain text or ANSI."""
    c = _C if color else dict.fromkeys(_C, "")
    cols = ["step"] + [k for k in HEADERS if k != "step" and k in source]
    marks = {a.step: ("yellow" if a.kind == "length" else "red") for a in alerts if a.severity == "warning"}
    width = {k: max(len(HEADERS[k]), 8) for k in cols}
    out = [f"{c['bold']}phantom watch{c['reset']} {path}  ({len(table)} steps"
           + (", last line incomplete" if torn else "") + (f", {bad_lines} unreadable line(s)" if bad_lines else "")
           + ")" + (f"  run {status}" if status else "")]
    out.append(c["bold"] + "  ".join(f"{HEADERS[k]:>{width[k]}}" for k in cols) + c["reset"])
    for t in table[-rows:]:
        cells = []
        for k in cols:
            v = t.get(k)
            cells.append(f"{v:>{width[k]}}" if k == "step" else f"{'-' if v is None else format(v, _FMT[k]):>{width[k]}}")
        line = "  ".join(cells)
        out.append(f"{c[marks[t['step']]]}{line}{c['reset']}" if t["step"] in marks else line)
    if not table:
        out.append(f"{c['dim']}(no complete records yet){c['reset']}")
    keys = ", ".join(f"{HEADERS[k]}={source[k]}" for k in cols if k in source)
    out.append(f"{c['dim']}keys: {keys or 'none of the known metric keys'}{c['reset']}")
    for a in alerts:
        tone = "yellow" if a.kind == "length" else "red" if a.severity == "warning" else "dim"
        out.append(f"{c[tone]}{a.severity.upper()} [{a.kind}] {a.message}{c['reset']}")
    return "\n".join(out)


@dataclass
class WatchResult:
    alerts: list[Alert] = field(default_factory=list)
    steps: int = 0
    error: str | None = None  # why the watch read nothing (exit 2), see key_problem


def follow(tail: MetricsTail, *, interval: float, emit: Callable[[str], None], opts: dict[str, Any],
           timeout: float | None = None, until_done: bool = False, sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> WatchResult:
    """Poll ``tail`` every ``interval`` seconds and emit a redrawn table whenever it changes."""
    start, result, waiting = clock(), WatchResult(), False
    while True:
        if tail.poll() or (not waiting and not tail.path.exists()):
            if tail.path.exists():
                table, source = indicators(tail.rows, val_key=opts["val_key"])
                result.error = key_problem(tail, source, opts["val_key"], final=False)
                if result.error:
                    return result
                result.alerts = detect(table, length_drop=opts["length_drop"], acc_drop=opts["acc_drop"])
                result.steps = len(table)
                emit(render(table, source, result.alerts, path=str(tail.path), rows=opts["rows"],
                            color=opts["color"], torn=tail.torn, bad_lines=tail.bad_lines,
                            status=run_status(tail.path)))
            else:
                emit(f"waiting for {tail.path} ...")
                waiting = True
        if (until_done and _finished(tail.path)) or (timeout is not None and clock() - start >= timeout):
            if not result.steps:
                why = "never appeared" if not tail.path.exists() else "holds no complete record"
                until = "before the run finished" if until_done and _finished(tail.path) else \
                    f"within --timeout {timeout:g} s"
                result.error = f"{tail.path} {why} {until}"
            return result
        sleep(interval)


def _finished(metrics: Path) -> bool:
    try:
        status = json.loads((metrics.parent / "manifest.json").read_text()).get("status")
    except (OSError, json.JSONDecodeError, AttributeError):
        return False
    return status in ("done", "failed", "interrupted")


def _parser() -> argparse.ArgumentParser:
    from phantom.cli import ArgTypes, command_parser, exit_codes

    codes = exit_codes("a warning fired (length or accuracy fell)",
                       c2="the file cannot be read, never appeared, or holds none of the known metric keys; a "
                          "--val-key that matches nothing; a bad flag")
    ap = command_parser("phantom watch", "Follow a run's metrics.jsonl and warn on the leading indicators: the "
                        "all-fail fraction, phantom groups, mean response length and validation accuracy. Length "
                        "falling while accuracy holds is the early warning of a phantom collapse.",
                        ["phantom watch runs/<run>                     # follow a run folder until Ctrl-C",
                         "phantom watch --once runs/<run>/metrics.jsonl",
                         "phantom watch --until-done --timeout 3600 checkpoints/my_run/metrics.jsonl",
                         "phantom watch --once metrics.jsonl --val-key gsm8k --length-drop 0.3"], codes,
                        notes="Known keys: " + ", ".join(known_keys()))
    ap.add_argument("metrics", help="a metrics.jsonl (verl file logger or phantom lab) or a run folder")
    ap.add_argument("--once", action="store_true", help="print the table once and exit (exit 1 on a warning)")
    ap.add_argument("--interval", type=ArgTypes.positive, default=2.0, help="seconds between polls (default 2)")
    ap.add_argument("--length-drop", type=float, default=LENGTH_DROP,
                    help=f"warn when mean length falls by this fraction of its start, 0 < x < 1 (default {LENGTH_DROP:g})")
    ap.add_argument("--acc-drop", type=float, default=ACC_DROP,
                    help=f"accuracy alarm when validation accuracy falls this far below its first value "
                         f"(absolute, 0 < x < 1, default {ACC_DROP:g})")
    ap.add_argument("--val-key", help="part of the validation key picking its data source (default: the first); "
                                      "exit 2 when it matches none")
    ap.add_argument("--rows", type=ArgTypes.count, default=15, help="steps shown (default 15)")
    ap.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                    help="auto (on a terminal), always or never")
    ap.add_argument("--timeout", type=ArgTypes.positive, help="stop following after this many seconds (exit 2 if "
                                                              "no record came)")
    ap.add_argument("--until-done", action="store_true",
                    help="stop when the run folder's manifest is done, failed or interrupted")
    return ap


@_exit_code
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("length_drop", "acc_drop"):
        if not 0.0 < getattr(args, name) < 1.0:
            print(f"phantom watch: --{name.replace('_', '-')} {getattr(args, name)} is invalid; allowed: 0 < x < 1",
                  file=sys.stderr)
            return 2
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    opts = {"val_key": args.val_key, "length_drop": args.length_drop, "acc_drop": args.acc_drop, "rows": args.rows,
            "color": color}
    tail = MetricsTail(args.metrics)
    if args.once:
        if not tail.path.is_file():
            print(f"phantom watch: {tail.path}: no such file", file=sys.stderr)
            return 2
        tail.poll()
        table, source = indicators(tail.rows, val_key=args.val_key)
        if not table:
            print(f"phantom watch: {tail.path}: no complete {{\"step\": n, \"data\": ...}} records", file=sys.stderr)
            return 2
        problem = key_problem(tail, source, args.val_key, final=True)
        if problem:
            print(f"phantom watch: {problem}", file=sys.stderr)
            return 2
        alerts = detect(table, length_drop=args.length_drop, acc_drop=args.acc_drop)
        print(render(table, source, alerts, path=str(tail.path), rows=args.rows, color=color, torn=tail.torn,
                     bad_lines=tail.bad_lines, status=run_status(tail.path)))
        return 1 if any(a.severity == "warning" for a in alerts) else 0
    clear = "\x1b[H\x1b[2J" if color else ""

    def emit(text: str) -> None:
        print(clear + text + ("" if color else "\n"), flush=True)

    res = follow(tail, interval=args.interval, emit=emit, opts=opts, timeout=args.timeout,
                 until_done=args.until_done)  # Ctrl-C: phantom.cli's policy (one line, exit 130)
    if res.error:
        print(f"phantom watch: {res.error}", file=sys.stderr)
        return 2
    return 1 if any(a.severity == "warning" for a in res.alerts) else 0
