"""Read an input's text the way a careful person would: size first, then bytes, then clean text.

Real configs arrive with a UTF-8 byte-order mark (Windows editors), CRLF line ends, terminal colour
codes pasted from a log (``\\x1b[32m``), a stray NUL byte, or are not configs at all (a 50 MB
checkpoint index someone globbed in). Each of these used to crash a reader or take a minute. Here
the size is checked before a byte is read (:data:`MAX_BYTES`), a file that is mostly binary is
refused, and the rest is cleaned: the BOM is dropped, CRLF becomes LF, and colour codes and other
control characters are removed, each counted in a :class:`TextNotes` so the report can say what was
changed and where (bash keeps a ``\\r`` as part of every value; Hydra's YAML loader rejects control
characters), never silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from phantom.audit.model import InputError

__all__ = ["MAX_BYTES", "TextNotes", "read_text", "clean_text"]

#: Largest input read (bytes). verl/TRL configs and launch scripts are kilobytes: the largest public
#: verl launch script we surveyed is under 10 kB, verl's fully composed ppo_trainer config 35 kB.
#: benchmarks/bench_audit.py shows the audit answers in well under 2 s of CPU at this size (YAML
#: is the slow form: about 2.5 s of CPU per MiB), and refuses a 50 MB file at once.
MAX_BYTES = 512 * 1024
_ANSI = re.compile(r"\x1b\[[0-9;:?<=>]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass
class TextNotes:
    """What cleaning changed: counts and the first line of each kind."""

    bom: bool = False
    crlf_lines: int = 0
    ansi: int = 0
    control: int = 0
    invalid_utf8: int = 0
    first_line: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.bom or self.crlf_lines or self.ansi or self.control or self.invalid_utf8)

    def describe(self) -> list[str]:
        out = []
        if self.bom:
            out.append("a UTF-8 byte-order mark (removed)")
        if self.crlf_lines:
            out.append(f"{self.crlf_lines} CRLF line end(s) (read as LF)")
        if self.ansi:
            out.append(f"{self.ansi} terminal colour code(s) from line {self.first_line['ansi']} (removed)")
        if self.control:
            out.append(f"{self.control} control character(s) such as NUL from line {self.first_line['control']} "
                       "(removed)")
        if self.invalid_utf8:
            out.append(f"{self.invalid_utf8} byte(s) that are not UTF-8 from line {self.first_line['utf8']} "
                       "(replaced)")
        return out


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def clean_text(text: str, notes: TextNotes | None = None) -> tuple[str, TextNotes]:
    """``text`` without BOM, CR before LF, ANSI escape sequences and control characters."""
    notes = notes or TextNotes()
    if text.startswith("\ufeff"):
        text, notes.bom = text[1:], True
    if "\r" in text:
        notes.crlf_lines = text.count("\r\n")
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    m = _ANSI.search(text)
    if m:
        notes.first_line["ansi"] = _line_of(text, m.start())
        text, notes.ansi = _ANSI.subn("", text)
    m = _CONTROL.search(text)
    if m:
        notes.first_line["control"] = _line_of(text, m.start())
        text, notes.control = _CONTROL.subn("", text)
    return text, notes


def _binary(data: bytes) -> bool:
    """Mostly not text: many NULs, or over 10% control bytes or bytes that do not decode as UTF-8."""
    if not data:
        return False
    if data.count(b"\x00") > max(16, len(data) // 100):
        return True
    sample = data[:65536]
    control = sum(1 for b in sample if b < 32 and b not in (9, 10, 12, 13, 27))
    bad = sample.decode("utf-8", errors="replace").count("\ufffd") - sample.decode("utf-8", errors="ignore").count(
        "\ufffd")
    return (control + bad) > len(sample) // 10


def read_text(path: str) -> tuple[str, TextNotes]:
    """The cleaned text of ``path`` (a run folder: its ``manifest.json``), or :class:`InputError`."""
    p = Path(path)
    if p.is_dir() and (p / "manifest.json").is_file():
        p = p / "manifest.json"
    try:
        size = p.stat().st_size
        if p.is_dir():
            raise InputError(path, "is a directory; pass the config file inside it")
        if size > MAX_BYTES:
            raise InputError(path, f"is {size / 2**20:.1f} MiB; the audit reads configs and launch scripts up to "
                                   f"{MAX_BYTES // 1024} KiB (they are kilobytes): is this the right file?")
        with p.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except OSError as exc:
        raise InputError(path, f"cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_BYTES:  # grew while we looked, or a device file
        raise InputError(path, f"is larger than {MAX_BYTES // 1024} KiB; the audit reads configs up to that size")
    if _binary(data):
        raise InputError(path, "is a binary file (not text: NUL or other control bytes, or bytes that are not "
                               "UTF-8), not a config or launch script")
    notes = TextNotes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        notes.first_line["utf8"] = data.count(b"\n", 0, exc.start) + 1
        text = data.decode("utf-8", errors="replace")
        notes.invalid_utf8 = text.count("\ufffd")
    text, notes = clean_text(text, notes)
    if not text.strip():
        raise InputError(path, "the file is empty")
    return text, notes
