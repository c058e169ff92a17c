"""The audit's result: per-input findings, rendered as text for people or JSON for CI."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from typing import Any

from phantom.audit.facts import RewardFacts
from phantom.audit.model import SEVERITIES, Finding, InputError
from phantom.audit.probe import ProbeResult

__all__ = ["InputReport", "Report", "render_json", "render_text"]

_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass
class InputReport:
    path: str
    kind: str | None = None
    form: str | None = None
    trainer: str | None = None
    facts: RewardFacts | None = None
    findings: list[Finding] = field(default_factory=list)
    error: InputError | None = None


@dataclass
class Report:
    inputs: list[InputReport]
    probes: list[ProbeResult] = field(default_factory=list)
    version: str = "0.9.1"
    fail_on: str = "warning"

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.inputs for f in r.findings]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(SEVERITIES, 0)
        for f in self.findings:
            out[f.severity] += 1
        return out

    @property
    def exit_code(self) -> int:
        """2: an input could not be read; 1: findings at or above ``fail_on``; 0: clean."""
        if any(r.error is not None for r in self.inputs):
            return 2
        limit = _RANK[self.fail_on]
        return 1 if any(_RANK[f.severity] <= limit for f in self.findings) else 0


def _facts_dict(f: RewardFacts | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"composite": f.composite, "verdict": f.verdict, "score_shaped": f.score_shaped, "overlong": f.overlong,
            "returns": f.returns, "acc_binary": f.acc_binary,
            "evidence": [{"text": e.text, "key": e.key, "where": e.where} for e in f.evidence]}


def render_json(rep: Report) -> str:
    inputs = []
    for r in rep.inputs:
        inputs.append({
            "path": r.path, "kind": r.kind, "form": r.form, "trainer": r.trainer, "reward": _facts_dict(r.facts),
            "findings": [f.to_dict() for f in r.findings],
            "error": None if r.error is None else {"message": r.error.message, "line": r.error.line,
                                                   "key": r.error.key, "text": str(r.error)},
        })
    probes = [{"target": p.target, "style": p.style, "returns": p.returns, "summary": p.summary(),
               "rows": [{"response": row.response[:60], "certainly_wrong": row.certainly_wrong, "score": row.score,
                         "error": row.error} for row in p.rows]} for p in rep.probes]
    return json.dumps({"tool": "phantom audit", "schema": 1, "verl_version": rep.version, "inputs": inputs,
                       "probes": probes, "summary": rep.counts(), "exit_code": rep.exit_code}, indent=2,
                      default=str)


def _wrap(label: str, text: str) -> list[str]:
    return textwrap.wrap(text, width=104, initial_indent=f"      {label}", subsequent_indent=" " * (6 + len(label)))


def render_text(rep: Report) -> str:
    lines: list[str] = []
    clean = 0
    for r in rep.inputs:
        kind = " ".join(x for x in (r.kind, r.form) if x)
        head = f"{r.path}  [{kind}" + (f", trainer: {r.trainer}" if r.trainer else "") + "]" if kind else r.path
        lines.append(head)
        if r.error is not None:
            lines.append(f"  unreadable: {r.error}")
            lines.append("")
            continue
        if r.facts is not None:
            ev = "; ".join(e.text + (f" ({e.where})" if e.where else "") for e in r.facts.evidence) or "no evidence"
            lines += textwrap.wrap(f"reward: {r.facts.verdict} - {ev}", width=110, initial_indent="  ",
                                   subsequent_indent="    ")
        if not any(_RANK[f.severity] <= _RANK[rep.fail_on] for f in r.findings):
            clean += 1
            lines.append("  clean: no phantom-prone settings found" + (" (notes below)" if r.findings else ""))
        for f in sorted(r.findings, key=lambda f: (_RANK[f.severity], f.line or 0)):
            lines.append(f"  {f.where}: {f.severity} {f.rule} {f.name}" + (f"  [{f.key}]" if f.key else ""))
            lines += _wrap("", f.message)
            lines += _wrap("why: ", f"{f.why} (see {f.chapter})")
            lines += _wrap("fix: ", f.fix)
        lines.append("")
    c = rep.counts()
    unreadable = sum(r.error is not None for r in rep.inputs)
    lines.append(f"summary: {c['error']} error(s), {c['warning']} warning(s), {c['info']} note(s) in "
                 f"{len(rep.inputs)} input(s); {clean} clean" + (f", {unreadable} unreadable" if unreadable else "")
                 + f"; exit {rep.exit_code}")
    return "\n".join(lines)
