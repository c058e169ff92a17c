"""phantom.verl.data: GSM8K / MATH parquet from local fixtures in the Hub schema (no network), the lab task."""

from __future__ import annotations

import pandas as pd
import pytest

from phantom.verl.data import GSM8K_INSTRUCTION, MATH, build_gsm8k, build_math, lab_rows, main
from phantom.verl.reward import compute_score

pytest.importorskip("verl.utils.reward_score.math_reward")


@pytest.fixture()
def gsm8k_source(tmp_path):
    """openai/gsm8k 'main' schema: question, answer ('... #### n', thousands separators allowed)."""
    src = tmp_path / "gsm8k_src"
    src.mkdir()
    for split, n in (("train", 6), ("test", 3)):
        pd.DataFrame({
            "question": [f"Tom has {i} apples and buys 1,000 more. How many?" for i in range(n)],
            "answer": [f"{i} + 1000 = <<{i}+1000={i + 1000}>>{i + 1000}\n#### {i + 1000:,}" for i in range(n)],
        }).to_parquet(src / f"{split}.parquet")
    return src


@pytest.fixture()
def math_source(tmp_path):
    """DigitalLearningGmbH/MATH-lighteval schema: problem, level, type, solution (with \\boxed{})."""
    src = tmp_path / "math_src"
    src.mkdir()
    rows = []
    for i in range(600):
        problem = f"Compute {i}/2." + (" Pad." * 200 if i % 97 == 0 else "")  # a few overlong prompts
        solution = f"Halve it: $\\boxed{{\\frac{{{i}}}{{2}}}}$." if i % 151 else "No final answer here."
        rows.append({"problem": problem, "level": "Level 1", "type": "Algebra", "solution": solution})
    pd.DataFrame(rows[:50]).to_parquet(src / "train.parquet")
    pd.DataFrame(rows).to_parquet(src / "test.parquet")
    return src


def test_gsm8k_rows_in_verl_schema(gsm8k_source, tmp_path):
    paths = build_gsm8k(tmp_path / "out", source=str(gsm8k_source))
    train = pd.read_parquet(paths["train"])
    assert len(train) == 6 and len(pd.read_parquet(paths["test"])) == 3
    row = train.iloc[2]
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith(GSM8K_INSTRUCTION)
    assert row["reward_model"]["ground_truth"] == "1002"  # separator stripped
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 2
    # the reward understands what the builder wrote
    assert compute_score(row["data_source"], "so 1,002 #### 1002", row["reward_model"]["ground_truth"])["acc"] == 1.0


def test_math_split_is_500_at_seed_42_minus_overlong(math_source, tmp_path):
    from phantom.verl.cpu.assets import ensure_tiny
    from phantom.verl.spec import tiny_root

    tok = ensure_tiny(tiny_root())["model"]  # a local tokenizer: no download in tests
    paths = build_math(tmp_path / "out", source=str(math_source), tokenizer=str(tok), max_prompt_length=300)
    test = pd.read_parquet(paths["test"])
    sampled = pd.read_parquet(math_source / "test.parquet").sample(n=500, random_state=42)
    keep = [p for p, s in zip(sampled["problem"], sampled["solution"]) if "Pad." not in p and "boxed" in s]
    assert 400 < len(keep) < 500  # the fixture plants some overlong prompts and unboxed solutions
    assert [r[0]["content"].split(" Let's")[0] for r in test["prompt"]] == keep  # same items, same order
    assert test.iloc[0]["data_source"] == MATH["data_source"]
    gold = test.iloc[0]["reward_model"]["ground_truth"]
    assert gold.startswith("\\frac{")
    assert compute_score(MATH["data_source"], f"so \\boxed{{{gold}}}", gold)["acc"] == 1.0
    everything = build_math(tmp_path / "all", source=str(math_source), tokenizer=None)
    assert len(pd.read_parquet(everything["test"])) == sum("boxed" in s for s in sampled["solution"])


def test_cli_errors_are_clear(tmp_path, capsys):
    assert main(["gsm8k", "--source", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "train.parquet does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_math_bad_tokenizer_fails_clearly_and_writes_nothing(math_source, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["math", "--source", str(math_source), "--out", str(out), "--tokenizer", str(tmp_path / "no_tok")]) == 2
    assert "could not load tokenizer" in capsys.readouterr().err and not out.exists()


def test_cli_builds_gsm8k(gsm8k_source, tmp_path, capsys):
    assert main(["gsm8k", "--source", str(gsm8k_source), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "train.parquet").is_file() and "test:" in capsys.readouterr().out


def test_lab_rows_use_the_strict_checker():
    class P:  # the lab's Problem contract: .prompt, .solution ending in '#### <int>', .answer
        prompt, solution, answer = "Q:12+30\n", "12+30=42####42", 42

    row = lab_rows([P()], "train")[0]
    assert row["data_source"] == "phantom_lab" and row["reward_model"]["ground_truth"] == "42"
    assert compute_score("phantom_lab", P.solution, "42")["acc"] == 1.0
    assert compute_score("phantom_lab", "42", "42")["acc"] == 0.0  # no marker, no credit


def test_lab_task_in_verl_form(tmp_path):
    task = pytest.importorskip("phantom.lab.task", reason="the CPU lab (phantom.lab.task) is not built yet")
    from phantom.verl.data import build_lab

    paths = build_lab(tmp_path, n_train=8, n_test=4)
    df = pd.read_parquet(paths["train"])
    assert len(df) == 8 and set(df["data_source"]) == {"phantom_lab"}
    assert task is not None
