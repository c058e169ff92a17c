"""Findings about the reading itself (PH060, PH061): never "clean" after reading nothing.

A launch script whose trainer command passes no override the audit can read (everything comes from
``"$@"``, a Hydra ``--config-name`` or a TRL ``--config`` file that is not there) is not clean: the
audit has seen nothing. And text the audit had to clean (terminal colour codes, NUL bytes, CRLF line
ends in a bash script) is text the trainer would choke on or misread.
"""

from __future__ import annotations

from phantom.audit.model import ConfigDoc, Finding, chapter

__all__ = ["read_findings"]


def read_findings(doc: ConfigDoc) -> list[Finding]:
    out = []
    r = doc.read
    if doc.form == "shell" and r.overrides == 0:
        where = []
        if r.caller_args:
            where.append('the arguments the script is called with ("$@")')
        where += [n for n in r.notes if "config" in n]
        src = "; ".join(where) or "nothing the file sets"
        out.append(Finding(
            "PH060", "nothing-read", "warning", None,
            f"{r.source}: the trainer command passes no setting the audit could read, so it cannot call this run "
            f"clean; its settings come from {src}",
            "a guard that reports 'clean' after reading nothing is worse than no guard",
            "audit the config the command uses (its YAML, or the override list it is called with), or pass the "
            "overrides on the command line in the script", chapter("reference"), doc.path, r.line))
    bad = [c for c in r.cleaned if "colour" in c or "control" in c]
    if bad or r.crlf_shell:
        what = "; ".join(bad + (["CRLF line ends in a bash script"] if r.crlf_shell else []))
        why = ("bash reads the \\r of a CRLF line end as part of each value (metric=acc\\r is not acc)"
               if r.crlf_shell else "PyYAML, and so Hydra and TRL, refuse a config holding control characters")
        fix = "dos2unix the script" if r.crlf_shell and not bad else (
            "remove them (e.g. sed 's/\\x1b\\[[0-9;]*m//g'; tr -d '\\000')" + ("; dos2unix" if r.crlf_shell else ""))
        out.append(Finding("PH061", "input-cleaned", "warning", None,
                           f"the file holds {what}; the audit removed them to read it", why, fix, chapter("reference"),
                           doc.path, None))
    return out
