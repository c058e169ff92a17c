"""Data types shared by the audit's readers, rules and report.

A configuration, whatever its form (YAML, JSON, Hydra overrides, a shell launch script, a TRL
Python file), becomes one :class:`ConfigDoc`: a flat ``dotted.key -> Entry`` map that remembers
where each value came from, so every finding can name the file and line a user has to edit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "BOOK",
    "DELETE",
    "SEVERITIES",
    "ConfigDoc",
    "Entry",
    "Evidence",
    "Finding",
    "InputError",
    "ReadInfo",
    "Unresolved",
    "chapter",
]

#: Book chapters the findings link to (file names in ``_toc.yml``); one place to update.
BOOK: dict[str, str] = {
    "phantom": "book/chapters/02_phantom_advantage.md",
    "filter": "book/chapters/03_filter.md",
    "verl": "book/chapters/05_verl_runs.md",
    "verl_ref": "book/chapters/appendix_verl.md",  # legacy trainer, Hydra composition: how verl is run
    "estimators": "book/chapters/07_estimators.md",
    "what_not": "book/chapters/08_what_does_not_matter.md",
    "rules": "book/chapters/09_rules.md",
    "defaults": "book/chapters/appendix_defaults.md",
    "reference": "book/chapters/appendix_audit.md",
}

#: Most to least severe. ``error``: the run is phantom-prone or misconfigured as written;
#: ``warning``: it may be, and the audit cannot tell without more input; ``info``: worth knowing.
SEVERITIES: tuple[str, ...] = ("error", "warning", "info")


def chapter(topic: str) -> str:
    """The book chapter for a topic (KeyError on an unknown topic: a bug in a rule)."""
    return BOOK[topic]


class InputError(ValueError):
    """An input the audit cannot read; the CLI turns it into exit code 2 (internal errors are 3)."""

    def __init__(self, path: str, message: str, line: int | None = None, key: str | None = None):
        self.path, self.line, self.key, self.message = path, line, key, message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {f'{key}: ' if key else ''}{message}")


@dataclass(frozen=True)
class Unresolved:
    """A value the audit could not resolve statically (a shell variable, an expression, a branch).

    ``why`` says what is unknown; ``options`` holds the values seen where a script sets it in
    several branches (``if``/``case``), when the audit could read them.
    """

    text: str
    why: str = field(default="", compare=False)
    options: tuple[str, ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        return self.text


@dataclass
class ReadInfo:
    """What a reader found in an input, so no report is ever "clean" after reading nothing."""

    source: str = ""  # e.g. "command 2 of 3, line 57: python3 -m verl.trainer.main_ppo"
    commands: int = 0  # shell commands in the file
    trainer_commands: int = 0
    overrides: int = 0  # values read for this audit (overrides, YAML keys, GRPOConfig kwargs)
    unresolved: list[str] = field(default_factory=list)  # keys whose value the file does not fix
    conditional: list[str] = field(default_factory=list)  # keys set only in some branches
    caller_args: bool = False  # the command also passes the script's own arguments ("$@")
    notes: list[str] = field(default_factory=list)
    line: int | None = None
    context: str = ""
    cleaned: list[str] = field(default_factory=list)  # what text cleaning changed (BOM, CRLF, colour codes)
    crlf_shell: bool = False  # a bash script with CRLF line ends: bash keeps "\r" in every value

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Entry:
    """One configured value and where it was set."""

    key: str
    value: Any
    file: str
    line: int | None = None
    raw: str | None = None  # the text as written, when it differs from ``key=value``

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


@dataclass
class ConfigDoc:
    """A configuration reduced to dotted keys, with its kind and form.

    ``kind`` is the config family (``verl``, ``trl``, ``easyr1``, ``openrlhf``, ``swift``, ``nemo``,
    ``oat``, ``lab``); ``form`` is how it was written (``yaml``, ``json``, ``overrides``, ``shell``,
    ``python``); ``entrypoint`` is the registry name of the trainer the launch script runs
    (:mod:`phantom.audit.trainers`; ``unknown:<module>`` for one the registry lacks), when it names one.
    """

    path: str
    kind: str
    form: str
    entries: dict[str, Entry] = field(default_factory=dict)
    entrypoint: str | None = None
    mentions: set[str] = field(default_factory=set)  # identifiers seen in the text (e.g. TRL metrics)
    read: ReadInfo = field(default_factory=ReadInfo)
    label: str | None = None  # which command of a script this is ("command 2, line 57")
    #: Hydra's --config-name / --config-path when the command names its own config (keys then unchecked)
    config_name: str | None = None
    #: reward functions defined in (or imported next to) a Python input, by name: their bodies' shapes
    bodies: dict[str, Any] = field(default_factory=dict)

    def entry(self, key: str) -> Entry | None:
        e = self.entries.get(key)
        return None if e is None or e.value is DELETE else e

    def has(self, key: str) -> bool:
        return self.entry(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        e = self.entry(key)
        return default if e is None else e.value

    def under(self, prefix: str) -> dict[str, Entry]:
        """Entries below ``prefix`` (keys relative to it)."""
        p = prefix.rstrip(".") + "."
        return {k[len(p):]: e for k, e in self.entries.items() if k.startswith(p) and e.value is not DELETE}

    def set(self, entry: Entry) -> None:
        self.entries[entry.key] = entry
        if isinstance(entry.value, dict) and entry.value:  # `algorithm.filter_groups={enable: True, ...}`
            for k, v in entry.value.items():
                self.set(Entry(f"{entry.key}.{k}", v, entry.file, entry.line, entry.raw))

    def merged(self, other: ConfigDoc) -> ConfigDoc:
        """``other`` layered on top of this one (Hydra semantics: later values win)."""
        if other.kind != self.kind:
            raise InputError(other.path, f"cannot merge a {other.kind} config into a {self.kind} one")
        doc = ConfigDoc(f"{self.path}+{other.path}", self.kind, "merged", dict(self.entries),
                        other.entrypoint or self.entrypoint, self.mentions | other.mentions,
                        config_name=other.config_name or self.config_name, bodies={**self.bodies, **other.bodies})
        doc.read = ReadInfo(f"{self.path} with {other.path} on top", overrides=len(self.entries) + len(other.entries),
                            unresolved=self.read.unresolved + other.read.unresolved,
                            conditional=self.read.conditional + other.read.conditional)
        for key, e in other.entries.items():
            if e.value is DELETE:
                doc.entries.pop(key, None)
            else:
                doc.entries[key] = e
        return doc


#: Marker for a Hydra ``~key`` deletion inside an override list.
DELETE = Unresolved("<deleted>")


@dataclass(frozen=True)
class Evidence:
    """Why the audit believes something about the reward (a key, a probe result, a flag)."""

    text: str
    key: str | None = None
    where: str | None = None


@dataclass(frozen=True)
class Finding:
    """One problem: what, where, why (one sentence, with a book chapter) and the fix."""

    rule: str  # stable id, e.g. "PH001"
    name: str  # slug, e.g. "filter-on-shaped-metric"
    severity: str
    key: str | None
    message: str
    why: str
    fix: str
    chapter: str
    file: str | None = None
    line: int | None = None
    #: the fix as data, so tests (and tools) can apply it: verl overrides, and what they must set in
    #: verl's composed config; TRL ``GRPOConfig`` keyword arguments
    fix_overrides: tuple[str, ...] = ()
    fix_expect: dict[str, Any] = field(default_factory=dict)
    fix_kwargs: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = ()  # every key a merged finding covers
    #: a fix in another trainer's syntax (CLI arguments or config keys), and how it was checked: verl
    #: overrides are composed against verl's Hydra config in the tests; other trainers' are "constructed"
    fix_args: tuple[str, ...] = ()
    fix_status: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity={self.severity!r} is unknown; allowed: {', '.join(SEVERITIES)}")

    @property
    def where(self) -> str:
        if self.file and self.line:
            return f"{self.file}:{self.line}"
        return self.file or "-"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
