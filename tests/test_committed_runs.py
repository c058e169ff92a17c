"""Committed data earns its place: every folder under data/runs/ is listed in data/runs/README.md, has its
own README, holds only finished runs, and is read by a chapter, test or benchmark named in its row."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "runs"
FOLDERS = sorted(p.name for p in RUNS.iterdir() if p.is_dir())


def table() -> dict[str, str]:
    """folder -> its 'read by' cell in data/runs/README.md."""
    out = {}
    for line in (RUNS / "README.md").read_text().splitlines():
        if m := re.match(r"\| `([^`/]+)/` \|[^|]*\| ([^|]*) \|", line):
            out[m.group(1)] = m.group(2)
    return out


def test_every_folder_is_listed_and_every_listed_folder_exists():
    assert sorted(table()) == FOLDERS


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folder_has_a_readme_and_only_finished_runs(folder):
    assert (RUNS / folder / "README.md").is_file()
    manifests = list((RUNS / folder).glob("**/manifest.json"))
    assert manifests, folder
    for m in manifests:
        # starved: a verl run the refill bound stopped (phantom.verl.starve), an ended run, not a broken one
        assert json.loads(m.read_text())["status"] in ("done", "starved"), m
        assert (m.parent / "metrics.jsonl").is_file(), m


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folder_is_read_where_its_row_says(folder):
    """Every chapter or file its row names mentions the folder (a chapter by its number or title page)."""
    readers = table()[folder]
    files = [ROOT / f for f in re.findall(r"`((?:tests|benchmarks|book)/[^`]+)`", readers)]
    chapters = [int(n) for n in re.findall(r"chapters? ([0-9](?:, [0-9])*)", readers) for n in n.split(", ")]
    chapter_files = [next((ROOT / "book" / "chapters").glob(f"0{n}_*.md")) for n in chapters]
    pages = {"the lab notes": "appendix_lab_notes.md", "Re-run the lab": "appendix_rerun.md"}
    page_files = [ROOT / "book" / "chapters" / f for k, f in pages.items() if k in readers]
    named = files + chapter_files + page_files
    assert named, f"{folder}: its row names no reader"
    for f in named:
        assert f.is_file(), f
        assert f"data/runs/{folder}" in f.read_text() or f'"{folder}"' in f.read_text(), (folder, f.name)
