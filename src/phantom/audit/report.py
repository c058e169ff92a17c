"""The audit's result: per-input findings, rendered as text for people, JSON for CI, SARIF for code hosts.

The JSON form is stable (``"schema": 3``, described in ``docs/audit_json.md`` and checked by
``tests/test_audit_json.py``): fields are only ever added within a schema number. Every input says
what was read (``read``), so a CI job can tell "clean" from "read nothing".
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phantom.audit.facts import RewardFacts
from phantom.audit.model import SEVERITIES, Finding, InputError, ReadInfo
from phantom.audit.probe import ProbeResult

__all__ = ["SCHEMA", "InputReport", "Report", "render_json", "render_sarif", "render_text"]

SCHEMA = 3
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
    label: str | None = None  # which trainer command of a script
    read: ReadInfo | None = None
    internal: bool = False  # the error is a bug of the audit (exit 3), not a bad input
    trainer_label: str | None = None  # the entry point in words (phantom.audit.trainers)

    @property
    def name(self) -> str:
        return f"{self.path} ({self.label})" if self.label else self.path


@dataclass
class Report:
    inputs: list[InputReport]
    probes: list[ProbeResult] = field(default_factory=list)
    version: str = "0.9.1"
    fail_on: str = "warning"
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why) with --skip-non-trainer

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
        """3: internal error; 2: an input could not be read; 1: findings at or above ``fail_on``; 0: clean."""
        if any(r.internal for r in self.inputs):
            return 3
        if any(r.error is not None for r in self.inputs):
            return 2
        limit = _RANK[self.fail_on]
        return 1 if any(_RANK[f.severity] <= limit for f in self.findings) else 0


def _facts_dict(f: RewardFacts | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"composite": f.composite, "verdict": f.verdict, "score_shaped": f.score_shaped, "overlong": f.overlong,
            "returns": f.returns, "acc_binary": f.acc_binary, "spread": dict(f.spread),
            "builtin_scorers": [{"data_source": src, "module": sc.module if sc else None,
                                 "semantics": sc.semantics if sc else "unknown"} for src, sc in f.builtin],
            "evidence": [{"text": e.text, "key": e.key, "where": e.where} for e in f.evidence]}


def _finding_dict(f: Finding) -> dict[str, Any]:
    d = f.to_dict()
    d["fix_overrides"] = list(f.fix_overrides)
    d["fix_args"] = list(f.fix_args)
    d["keys"] = list(f.keys) or ([f.key] if f.key else [])
    return d


def render_json(rep: Report) -> str:
    inputs = []
    for r in rep.inputs:
        inputs.append({
            "path": r.path, "label": r.label, "kind": r.kind, "form": r.form, "trainer": r.trainer,
            "trainer_label": r.trainer_label,
            "read": r.read.to_dict() if r.read is not None else None, "reward": _facts_dict(r.facts),
            "findings": [_finding_dict(f) for f in r.findings],
            "error": None if r.error is None else {"message": r.error.message, "line": r.error.line,
                                                   "key": r.error.key, "text": str(r.error), "internal": r.internal},
        })
    probes = [{"target": p.target, "style": p.style, "returns": p.returns, "summary": p.summary(),
               "spread": p.spread(),
               "rows": [{"probe": row.probe.label if row.probe else None, "response": row.response[:60],
                         "certainly_wrong": row.certainly_wrong, "score": row.score, "error": row.error}
                        for row in p.rows]} for p in rep.probes]
    return json.dumps({"tool": "phantom audit", "schema": SCHEMA, "verl_version": rep.version, "inputs": inputs,
                       "skipped": [{"path": p, "why": w} for p, w in rep.skipped], "probes": probes,
                       "summary": rep.counts(), "exit_code": rep.exit_code}, indent=2, default=str)


def render_sarif(rep: Report) -> str:
    """SARIF 2.1.0, for code-scanning uploads (one result per finding; unreadable inputs as errors)."""
    from phantom.audit.rules import RULES

    level = {"error": "error", "warning": "warning", "info": "note"}
    results = []
    for r in rep.inputs:
        for f in r.findings:
            loc: dict[str, Any] = {"artifactLocation": {"uri": Path(f.file or r.path).as_posix()}}
            if f.line:
                loc["region"] = {"startLine": f.line}
            results.append({"ruleId": f.rule, "level": level[f.severity],
                            "message": {"text": f"{f.message}. Why: {f.why}. Fix: {f.fix}"},
                            "locations": [{"physicalLocation": loc}]})
        if r.error is not None:
            loc = {"artifactLocation": {"uri": Path(r.path).as_posix()}}
            if r.error.line:
                loc["region"] = {"startLine": r.error.line}
            results.append({"ruleId": "PH000", "level": "error", "message": {"text": str(r.error)},
                            "locations": [{"physicalLocation": loc}]})
    rules = [{"id": rid, "name": name, "shortDescription": {"text": text}} for rid, (name, text) in RULES.items()]
    rules.append({"id": "PH000", "name": "unreadable-input", "shortDescription": {"text": "input could not be read"}})
    return json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
                       "runs": [{"tool": {"driver": {"name": "phantom audit", "rules": rules}},
                                 "results": results}]}, indent=2)


def _wrap(label: str, text: str) -> list[str]:
    """Wrap prose; print code lines of a fix (``from x import y``, ``a = f(...)``) as they are."""
    out, pad = [], " " * (6 + len(label))
    for i, para in enumerate(text.split("\n")):
        if i and ("(" in para and "=" in para or para.startswith(("from ", "import "))):
            out.append(pad + para)
            continue
        out += textwrap.wrap(para, width=104, initial_indent=f"      {label}" if i == 0 else pad,
                             subsequent_indent=pad) or [""]
    return out


def _read_line(r: ReadInfo) -> list[str]:
    parts = [r.source] if r.source else []
    if r.commands:
        parts.append(f"{r.trainer_commands} trainer command(s) among {r.commands} command(s)")
    parts.append(f"{r.overrides} value(s) read")
    if r.unresolved:
        parts.append(f"unresolved: {', '.join(r.unresolved[:6])}" + (" ..." if len(r.unresolved) > 6 else ""))
    if r.conditional:
        parts.append(f"depends on the environment (set in if/case branches): {', '.join(r.conditional[:6])}"
                     + (" ..." if len(r.conditional) > 6 else ""))
    if r.context:
        parts.append(r.context)
    lines = textwrap.wrap("read: " + "; ".join(parts), width=110, initial_indent="  ", subsequent_indent="    ")
    for n in r.notes + [f"text: {c}" for c in r.cleaned]:
        lines += textwrap.wrap("note: " + n, width=110, initial_indent="  ", subsequent_indent="    ")
    return lines


def render_text(rep: Report) -> str:
    lines: list[str] = []
    clean = 0
    for r in rep.inputs:
        kind = " ".join(x for x in (r.kind, r.form) if x)
        trainer = r.trainer_label or r.trainer
        if r.trainer_label and r.trainer and r.trainer.endswith("(assumed)"):
            trainer += " (assumed)"
        head = f"{r.name}  [{kind}" + (f", trainer: {trainer}" if trainer else "") + "]" if kind else r.name
        lines.append(head)
        if r.error is not None:
            lines.append(f"  {'internal error' if r.internal else 'unreadable'}: {r.error}")
            lines.append("")
            continue
        if r.read is not None:
            lines += _read_line(r.read)
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
    for p, why in rep.skipped:
        lines.append(f"{p}  skipped: {why.split(';')[0]}")
    c = rep.counts()
    unreadable = sum(r.error is not None and not r.internal for r in rep.inputs)
    internal = sum(r.internal for r in rep.inputs)
    lines.append(f"summary: {c['error']} error(s), {c['warning']} warning(s), {c['info']} note(s) in "
                 f"{len(rep.inputs)} input(s); {clean} clean" + (f", {unreadable} unreadable" if unreadable else "")
                 + (f", {internal} internal error(s)" if internal else "")
                 + (f", {len(rep.skipped)} skipped" if rep.skipped else "") + f"; exit {rep.exit_code}")
    return "\n".join(lines)
