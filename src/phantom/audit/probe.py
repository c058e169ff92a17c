"""Call a reward function on a few probe responses to learn what it returns.

This is the only place the audit executes anything, and only a function the user named with
``--reward-fn PATH[:NAME]`` (a file, or ``pkg://module``). The probes are GSM8K-style answers to a
question whose gold answer is 42: correct and wrong, short and long. What matters for the phantom
is whether the function gives *different scores to different failures* (then an all-fail group
has spread) and whether a dict result carries a binary ``acc`` (verl's float fallback sets
``acc = score``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phantom.audit.model import InputError

__all__ = ["GOLD", "PROBES", "Probe", "ProbeResult", "load_reward_fn", "probe", "split_target"]

GOLD = "42"
_LONG = "Let me work through this carefully, one quantity at a time, and check each step. " * 6
_THINK = "<think>\nI add the numbers step by step.\n</think>\n"


@dataclass(frozen=True)
class Probe:
    """A probe answer. ``wrong``: certainly wrong for any checker of gold 42. ``fmt``: written in a
    format some checker rewards (``#### n``, ``\\boxed{}``, ``<think>``/``<answer>`` tags);
    ``size``: ``empty``, ``short``, ``long`` or ``overlong`` (about 6 kB, past a typical budget)."""

    text: str
    wrong: bool
    fmt: bool
    size: str
    label: str


#: Correct and wrong answers, formatted and not, short and long, so that format, length and
#: overlong spread among failures are each seen on their own (the phantom needs only one of them).
PROBES: tuple[Probe, ...] = (
    Probe("#### 42", False, True, "short", "right, #### format"),
    Probe(_LONG + "#### 42", False, True, "long", "right, long"),
    Probe("The answer is \\boxed{42}.", False, True, "short", "right, boxed"),
    Probe(_THINK + "<answer>\n\\boxed{42}\n</answer>", False, True, "short", "right, tagged"),
    Probe("#### 7", True, True, "short", "wrong, #### format"),
    Probe(_LONG + "#### 7", True, True, "long", "wrong, #### format, long"),
    Probe(_THINK + "<answer>\n\\boxed{7}\n</answer>", True, True, "short", "wrong, tagged"),
    Probe(_THINK.replace("step by step.", "step by step. " + _LONG) + "<answer>\n\\boxed{7}\n</answer>", True,
          True, "long", "wrong, tagged, long"),
    Probe(_LONG * 12 + "#### 7", True, True, "overlong", "wrong, #### format, overlong"),
    Probe("7", True, False, "short", "wrong, bare number"),
    Probe("I am not sure.", True, False, "short", "wrong, no answer"),
    Probe(_LONG + "so it is probably seven", True, False, "long", "wrong, no answer, long"),
    Probe("", True, False, "empty", "empty"),
)
#: seconds a probed reward function (its import, then all its probe calls) may take; --probe-timeout changes it
TIMEOUT_S = 20.0


class _Hang(BaseException):
    """Raised by the alarm inside user code; not an Exception subclass the user's own handlers expect."""


def split_target(target: str) -> tuple[str, str]:
    """``PATH[:NAME]`` -> (path, name); NAME defaults to verl's ``compute_score``."""
    head, sep, tail = target.rpartition(":")
    if sep and tail.isidentifier() and head and not head.endswith("/") and head != "pkg":
        return head, tail
    return target, "compute_score"


def _tail(buf: io.StringIO) -> str:
    """The last lines the user's code printed, for an error message."""
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()][-3:]
    return ("; it printed: " + " | ".join(ln[:160] for ln in lines)) if lines else ""


def load_reward_fn(target: str, timeout: float | None = None) -> tuple[Callable[..., Any], str]:
    """Import the module named by ``PATH[:NAME]`` (this runs its top level) and return the function.

    What the module prints goes to a buffer (quoted in an error), never to the audit's own stdout,
    which may be JSON. ``sys.exit`` at import, an exception, or an import that does not finish within
    ``timeout`` seconds is the user's error (:class:`InputError`, exit 2), named with the module.
    """
    path, name = split_target(target)
    label = f"{path}:{name}"
    limit = TIMEOUT_S if timeout is None else timeout
    buf = io.StringIO()
    try:
        with _time_limit(limit, f"importing {path}"), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            module = _import(path)
    except InputError:
        raise
    except SystemExit as exc:
        raise InputError(path, f"importing the reward module called sys.exit({exc.code!r}), so there is no function "
                               f"to probe{_tail(buf)}") from None
    except _Hang:
        raise InputError(path, f"importing the reward module did not finish within {limit:g} s (its top level "
                               f"hangs or waits for something){_tail(buf)}; raise --probe-timeout if it is slow") from None
    except Exception as exc:  # the user's module failed to import: say how
        raise InputError(path, f"importing the reward function failed: {type(exc).__name__}: {exc}{_tail(buf)}") \
            from None
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise InputError(path, f"no function {name!r} in it; functions found: {', '.join(found) or 'none'}")
    return fn, label


def _import(path: str) -> Any:
    try:
        if path.startswith("pkg://"):
            return importlib.import_module(path[len("pkg://"):])
        file = Path(path[len("file://"):] if path.startswith("file://") else path)
        if not file.is_file():
            raise InputError(path, "no such reward-function file")
        name_ = f"_phantom_probe_{abs(hash(file.resolve()))}"
        spec = importlib.util.spec_from_file_location(name_, file)
        if spec is None or spec.loader is None:
            raise InputError(path, "cannot import this file as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name_] = module  # as verl's loader does; dataclasses in the module need it
        spec.loader.exec_module(module)
        return module
    except ModuleNotFoundError as exc:
        if path.startswith("pkg://") and exc.name == path[len("pkg://"):].split(".")[0]:
            raise InputError(path, f"no module {exc.name!r} is importable here") from None
        raise


@dataclass
class ProbeRow:
    response: str
    certainly_wrong: bool
    score: float | None = None
    result: Any = None
    error: str | None = None
    probe: Probe | None = None


@dataclass
class ProbeResult:
    """What the probes showed. ``style`` is ``verl`` (one response per call) or ``trl`` (lists)."""

    target: str
    style: str
    rows: list[ProbeRow] = field(default_factory=list)

    @property
    def ok(self) -> list[ProbeRow]:
        return [r for r in self.rows if r.error is None]

    @property
    def returns(self) -> str | None:
        kinds = {"dict" if isinstance(r.result, dict) else "float" for r in self.ok}
        return None if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def keys(self) -> frozenset[str]:
        dicts = [set(r.result) for r in self.ok if isinstance(r.result, dict)]
        return frozenset(set.intersection(*dicts)) if dicts else frozenset()

    def values(self, key: str, *, failures: bool = False) -> list[Any]:
        """The values verl would store under ``reward_extra_info[key]`` for each probe."""
        out = []
        for r in self.ok:
            if failures and not r.certainly_wrong:
                continue
            extra = dict(r.result) if isinstance(r.result, dict) else {"acc": r.score}
            if key in extra:
                out.append(extra[key])
        return out

    def spread_among_failures(self, key: str = "score") -> bool | None:
        """Do certainly-wrong answers get different values? (None: no such values)."""
        vals = [float(v) for v in self.values(key, failures=True) if _number(v)] if key != "score" else [
            r.score for r in self.ok if r.certainly_wrong and r.score is not None]
        return None if len(vals) < 2 else (max(vals) - min(vals)) > 1e-12

    def spread(self) -> dict[str, bool | None]:
        """Which kinds of spread among failures the score shows (None: not measurable).

        ``format``: a formatted wrong answer vs an unformatted one of the same size; ``length``:
        the same format, short vs long; ``overlong``: long vs overlong; ``empty``: empty vs a short
        unformatted wrong answer.
        """
        by: dict[tuple[bool, str], list[float]] = {}
        for r in self.ok:
            if r.probe is not None and r.certainly_wrong and r.score is not None:
                by.setdefault((r.probe.fmt, r.probe.size), []).append(r.score)

        def differ(a: tuple[bool, str], b: tuple[bool, str]) -> bool | None:
            if a not in by or b not in by:
                return None
            return any(abs(x - y) > 1e-12 for x in by[a] for y in by[b])

        def tri_or(*vals: bool | None) -> bool | None:
            return True if True in vals else (False if all(v is False for v in vals) else None)

        return {"format": tri_or(differ((True, "short"), (False, "short")), differ((True, "long"), (False, "long"))),
                "length": tri_or(differ((True, "short"), (True, "long")), differ((False, "short"), (False, "long"))),
                "overlong": differ((True, "long"), (True, "overlong")),
                "empty": differ((False, "empty"), (False, "short"))}

    def binary(self, key: str) -> bool | None:
        vals = self.values(key)
        if not vals:
            return None
        return all(_number(v) and float(v) in (0.0, 1.0) for v in vals)

    def summary(self) -> str:
        ok = self.ok
        scores = sorted({round(r.score, 4) for r in ok if r.score is not None})
        shown = ", ".join(f"{s:g}" for s in scores[:6]) + (", ..." if len(scores) > 6 else "")
        ret = self.returns or "nothing"
        extra = f" with keys {{{', '.join(sorted(self.keys))}}}" if self.returns == "dict" else ""
        kinds = [k for k, v in self.spread().items() if v]
        spread = f"; wrong answers differ by {', '.join(kinds)}" if kinds else (
            "; all wrong answers score the same" if self.spread_among_failures() is False else "")
        return f"{self.target} returns {ret}{extra}; scores over {len(ok)} probes: {{{shown}}}{spread}"


def _number(v: Any) -> bool:
    return isinstance(v, (bool, int, float)) or (hasattr(v, "item") and callable(v.item))


@contextlib.contextmanager
def _time_limit(seconds: float, what: str = "the reward function") -> Iterator[None]:
    """Interrupt Python code running past ``seconds`` (SIGALRM; main thread only, Unix)."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def stop(*_: Any) -> None:
        raise _Hang(f"{what} did not return within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    out = fn(**kwargs)
    if inspect.isawaitable(out):
        import asyncio  # only for async reward functions (verl accepts them); costs 0.1 s to import

        out = asyncio.run(_await(out))
    return out


async def _await(x: Any) -> Any:
    return await x


def _style(fn: Callable[..., Any]) -> str:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "verl"
    return "trl" if ("completions" in params or "prompts" in params) and "solution_str" not in params else "verl"


def _scalar(value: Any) -> float:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    return float(value)


def probe(fn: Callable[..., Any], target: str, *, reward_kwargs: dict[str, Any] | None = None,
          data_source: str = "openai/gsm8k", timeout: float | None = None) -> ProbeResult:
    """Run the probes through ``fn`` the way verl (or TRL) would call it.

    The user's errors are :class:`InputError` (exit 2), named: a function that hangs past ``timeout``
    seconds, raises ``SystemExit``, fails on every probe, or returns NaN or an infinity (verl would
    train on it; no filter or normalization survives a NaN).
    """
    style = _style(fn)
    res = ProbeResult(target, style)
    kw = dict(reward_kwargs or {})
    limit = TIMEOUT_S if timeout is None else timeout
    buf = io.StringIO()
    try:
        with _time_limit(limit, target), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            if style == "verl":
                for pr in PROBES:
                    row = ProbeRow(pr.text, pr.wrong, probe=pr)
                    try:
                        out = _call(fn, {"data_source": data_source, "solution_str": pr.text, "ground_truth": GOLD,
                                         "extra_info": {}, **kw})
                        row.result = out
                        row.score = _scalar(out["score"] if isinstance(out, dict) else out)
                    except Exception as exc:  # a probe the function rejects is reported, not fatal
                        row.error = f"{type(exc).__name__}: {exc}"
                    res.rows.append(row)
            else:
                res.rows = _probe_trl(fn, kw)
    except _Hang:
        raise InputError(target, f"the reward function did not return within {limit:g} s on the probe answers (it "
                                 f"hangs, or waits for a server or a lock){_tail(buf)}; raise --probe-timeout if it "
                                 "is only slow") from None
    except SystemExit as exc:
        raise InputError(target, f"the reward function called sys.exit({exc.code!r}) on a probe answer{_tail(buf)}") \
            from None
    if not res.ok:
        first = res.rows[0].error if res.rows else "no result"
        raise InputError(target, f"the reward function failed on every probe input ({first}){_tail(buf)}")
    bad = [r for r in res.ok if r.score is not None and not math.isfinite(r.score)]
    if bad:
        r = bad[0]
        raise InputError(target, f"the reward function returned {r.score} for the probe "
                                 f"'{r.probe.label if r.probe else r.response[:30]}' ({len(bad)} of {len(res.ok)} "
                                 "probes not finite); a NaN or infinite reward poisons the group mean and std, so "
                                 "verl and TRL would train on it: return a finite number (0.0 for no credit)")
    return res


def _probe_trl(fn: Callable[..., Any], kw: dict[str, Any]) -> list[ProbeRow]:
    texts = [p.text for p in PROBES]
    n = len(texts)
    base = {"prompts": ["What is 6 * 7?"] * n, "solution": [GOLD] * n, "answer": [GOLD] * n,
            "ground_truth": [GOLD] * n, **kw}
    errors = []
    for completions in (texts, [[{"role": "assistant", "content": t}] for t in texts]):
        try:
            out = list(_call(fn, {**base, "completions": completions}))
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        rows = []
        for pr, value in zip(PROBES, out):
            row = ProbeRow(pr.text, pr.wrong, result=value, probe=pr)
            if value is None:
                row.error = "returned None"
            else:
                row.score = _scalar(value)
            rows.append(row)
        return rows
    return [ProbeRow(p.text, p.wrong, error=errors[-1], probe=p) for p in PROBES]

