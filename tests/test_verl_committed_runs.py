"""The committed verl CPU run logs (data/runs/verl_cpu_lab) load through the launcher's reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantom.verl.launch import read_run_metrics

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs" / "verl_cpu_lab"
ACC = "val-core/phantom_lab/acc/mean@1"


@pytest.mark.parametrize("arm", ["none", "score", "outcome"])
def test_committed_verl_run_reads_with_its_gate_telemetry(arm):
    run = RUNS / f"verl-cpu-lora-{arm}"
    assert json.loads((run / "manifest.json").read_text())["status"] == "done"
    df = read_run_metrics(run)
    assert list(df.index) == list(range(len(df))) and len(df) > 10
    assert df[ACC].notna().sum() >= 2, "held-out accuracy must be logged at least before and after training"
    assert df["phantom/groups/total"].dropna().gt(0).all(), "every training step carries the gate's GateStats"
