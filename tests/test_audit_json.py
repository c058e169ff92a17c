"""`--format json` follows the schema documented in docs/audit_json.md; SARIF is valid enough to upload."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from phantom.audit import main

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "audit"
SCHEMA = json.loads(re.search(r"```json\n(.*?)```", (ROOT / "docs" / "audit_json.md").read_text(), re.S).group(1))


def _out(capsys, *argv) -> dict:
    main([*map(str, argv), "--format", "json"])
    return json.loads(capsys.readouterr().out)


def test_schema_is_valid_json_schema():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("args", [
    [FIX / "shapes" / "sweep_loop.sh"],  # two inputs from one script
    [FIX / "shapes" / "nothing_read.sh", FIX / "malformed" / "bad_enable.yaml"],  # warning + unreadable
    [FIX / "trl_train.py", FIX / "verl_dapo_acc.sh", FIX / "shapes" / "verl_ansi.yaml"],
    [FIX / "overrides_filter_acc.txt", "--reward-fn", FIX / "rewards" / "length_shaped_dict.py"],  # probes
    [FIX / "shapes" / "no_trainer.sh", "--skip-non-trainer"],
    [FIX / "trainers" / "easyr1_filter_overall.sh", FIX / "trainers" / "swift_format_accuracy.sh",
     FIX / "trainers" / "nemo_overlong_no_filter.yaml", FIX / "trainers" / "trl_rloo_normalized.py",
     FIX / "trainers" / "hydra_rejected.sh", FIX / "trainers" / "unknown_entrypoint.sh"],  # every family
])
def test_json_output_matches_the_documented_schema(capsys, args):
    jsonschema = pytest.importorskip("jsonschema")
    out = _out(capsys, *args)
    jsonschema.validate(out, SCHEMA)
    assert out["schema"] == 3


def test_json_reports_what_was_read_and_fixes_as_data(capsys):
    out = _out(capsys, FIX / "shapes" / "recipe_legacy_overlong.sh")
    (inp,) = out["inputs"]
    assert inp["read"]["overrides"] == 9 and inp["trainer"] == "recipe"
    (f,) = inp["findings"]
    assert f["rule"] == "PH042" and "reward.reward_kwargs.overlong_buffer_cfg.enable=True" in f["fix_overrides"]
    assert f["fix_expect"]["reward.reward_kwargs.max_resp_len"] == 20480


def test_sarif(capsys):
    code = main([str(FIX / "shapes" / "two_commands.sh"), str(FIX / "malformed" / "bad_indent.yaml"),
                 "--format", "sarif"])
    sarif = json.loads(capsys.readouterr().out)
    assert code == 2 and sarif["version"] == "2.1.0"
    results = sarif["runs"][0]["results"]
    ids = {r["ruleId"] for r in results}
    assert {"PH001", "PH010", "PH000"} <= ids
    rules = {r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    assert ids <= rules
    assert all(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results)
