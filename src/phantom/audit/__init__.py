"""``phantom audit CONFIG...``: find phantom-prone settings in a GRPO/DAPO run's config or launch script.

Reads verl YAML configs, Hydra override lists, bash launch scripts (verl, verl-recipe, EasyR1,
TRL, OpenRLHF, ms-swift, NeMo-RL, oat; :mod:`phantom.audit.trainers` lists the entry points), TRL
``GRPOConfig``/``RLOOConfig`` settings (YAML, JSON, or keyword arguments in a Python file, parsed
and never run), EasyR1 and NeMo-RL YAML, and phantom run folders (a lab arm spec, or the overrides
a verl run was launched with), works out whether the reward is composite (reading the body of a
reward function it can find), and reports each phantom-prone setting with its severity, key, file
and line, a one-sentence why with the book chapter, and the fix in the trainer's own syntax. The
rules are listed in :mod:`phantom.audit.rules`. Only a reward function named with ``--reward-fn``
is ever executed.

Every report says what was read (commands found, overrides parsed, values left unresolved); a
trainer command whose settings the audit could not read is a warning (PH060), never "clean".
A launch script gets one audit per trainer command.

Exit codes: 0 clean, 1 findings (at or above ``--fail-on``), 2 an input could not be read (named,
with its line), 3 an internal error of the audit (the input is named; the other inputs of the batch
are still reported). ``--format json`` output is described in ``docs/audit_json.md`` (schema 3).

The package is the whole practitioner's guard: besides the config audit it holds
:mod:`phantom.audit.exposure` (``phantom exposure``: all-fail and phantom fractions of a rollout
dump) and :mod:`phantom.audit.watch` (``phantom watch``: the leading indicators on a live
``metrics.jsonl``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from phantom.audit.facts import RewardFacts, metric_signal, trl_facts, verl_facts
from phantom.audit.families import FAMILY_DEFAULTS, family_facts, family_findings
from phantom.audit.lab_rules import lab_facts, lab_findings
from phantom.audit.model import BOOK, ConfigDoc, Finding, InputError
from phantom.audit.notices import read_findings
from phantom.audit.probe import ProbeResult, load_reward_fn, probe, split_target
from phantom.audit.readers import read_config, read_configs
from phantom.audit.report import InputReport, Report
from phantom.audit.rules import AllSame, verl_findings
from phantom.audit.schema import Settings, validate
from phantom.audit.trainers import TRAINERS, by_name
from phantom.audit.trl_rules import trl_findings

__all__ = ["BOOK", "AllSame", "Finding", "InputError", "Report", "RewardFacts", "audit", "audit_doc", "main",
           "metric_signal", "read_config", "read_configs"]

_PROBE_SOURCE = "openai/gsm8k"
#: keys only a GRPO config has (TRL's DPO/SFT configs share beta, max_completion_length, use_vllm, ...)
_GRPO_KEYS = frozenset({"reward_funcs", "reward_weights", "scale_rewards", "num_generations",
                        "multi_objective_aggregation", "mask_truncated_completions", "importance_sampling_level",
                        "epsilon_high", "generation_batch_size", "num_iterations", "reward_model_name_or_path"})


def audit_doc(doc: ConfigDoc, *, version: str = "0.9.1", entrypoint: str | None = None,
              reward_fns: Sequence[tuple[Any, str]] = (), shaped: bool | None = None,
              all_same: AllSame | None = None, data_source: str | None = None, trl_version: str | None = None,
              probes_out: list[ProbeResult] | None = None, probe_timeout: float | None = None) -> InputReport:
    """Findings for one (validated) config; ``reward_fns`` are ``(function, label)`` pairs to probe."""
    s = Settings(validate(doc), version=version, entrypoint=entrypoint if doc.kind == "verl" else None)
    rep = InputReport(doc.path, doc.kind, doc.form, label=doc.label, read=doc.read)
    if doc.kind == "verl":
        rep.trainer = ("recipe" if s.spec.name == "recipe.dapo" else s.spec.name) + (
            " (assumed)" if s.entrypoint_assumed else "")
        rep.trainer_label = s.spec.label
        kwargs = {k: e.value for k, e in doc.under("reward.custom_reward_function.reward_kwargs").items()}
        pr = probe(reward_fns[0][0], reward_fns[0][1], reward_kwargs=kwargs,
                   data_source=data_source or _PROBE_SOURCE, timeout=probe_timeout) if reward_fns else None
        if pr is not None and probes_out is not None:
            probes_out.append(pr)
        rep.facts = verl_facts(s, pr, shaped, data_source=data_source)
        rep.findings = [_fix_status(f, s) for f in verl_findings(s, rep.facts, all_same=all_same)]
    elif doc.kind == "lab":
        rep.trainer = "phantom lab"
        rep.facts = lab_facts(s, shaped)
        rep.findings = lab_findings(s, rep.facts, all_same=all_same)
    elif doc.kind in FAMILY_DEFAULTS:
        rep.trainer, rep.trainer_label = _family_label(doc)
        rep.facts = family_facts(s)
        if shaped is not None:
            rep.facts.score_shaped = rep.facts.composite = shaped
        rep.findings = family_findings(s, rep.facts)
    else:
        if not (set(doc.entries) & _GRPO_KEYS) and not doc.mentions & {"async_grpo", "grpo_with_replay_buffer", "rloo"}:
            raise InputError(doc.path, "a TRL config without GRPO settings (none of "
                                       f"{', '.join(sorted(_GRPO_KEYS))}): not a GRPO run, nothing to audit")
        rloo = "rloo" in doc.mentions
        rep.trainer = "trl.rloo" if rloo else "trl" + (" (AsyncGRPO)" if "async_grpo" in doc.mentions else "")
        rep.trainer_label = "TRL RLOOTrainer" if rloo else "TRL " + (
            "AsyncGRPOTrainer" if "async_grpo" in doc.mentions else "GRPOTrainer")
        probes = {}
        for fn, label in reward_fns:
            pr = probe(fn, label, data_source=data_source or _PROBE_SOURCE, timeout=probe_timeout)
            probes[split_target(label)[1]] = pr
            if probes_out is not None:
                probes_out.append(pr)
        rep.facts = trl_facts(s, probes, shaped)
        rep.findings = family_findings(s, rep.facts) if rloo else trl_findings(s, rep.facts, trl_version=trl_version)
    rep.findings = read_findings(doc) + rep.findings
    return rep


#: verl entry points whose composed config tests/test_audit_fixes.py builds to check each printed override
_COMPOSED = frozenset({"main_ppo", "main_ppo_v0", "recipe.dapo", "fully_async"})


def _fix_status(f: Finding, s: Settings) -> Finding:
    """Say how a verl fix was checked: composed against the entry point's Hydra config, or constructed."""
    if not f.fix_overrides or f.fix_status:
        return f
    if s.spec.name in _COMPOSED and s.doc.config_name is None:
        where = "verl-recipe's DAPO config (the project's stub of it)" if s.spec.name == "recipe.dapo" else \
            f"verl 0.9.1's {s.spec.config}"
        return replace(f, fix_status=f"composed against {where} in tests/test_audit_fixes.py")
    return replace(f, fix_status=f"constructed: {s.spec.label}'s own config is not composed here")


def _family_label(doc: ConfigDoc) -> tuple[str, str]:
    try:
        t = by_name(doc.entrypoint) if doc.entrypoint else None
    except KeyError:
        t = None
    if t is None:
        t = next((x for x in TRAINERS if x.family == doc.kind), None)
    return (t.name, t.label) if t is not None else (doc.kind, doc.kind)


def _measure(path: str) -> AllSame:
    from phantom.audit.exposure import RolloutError, exposure, load_rollouts

    try:
        e = exposure(load_rollouts(path), source=path)
    except RolloutError as exc:
        raise InputError(path, f"--exposure: {exc}") from None
    return AllSame(e.frac(e.drop_outcome), e.frac(e.drop_score), f"measured on {Path(path).name}")


def _internal(path: str, exc: BaseException) -> InputReport:
    """An audit bug: say so, name the input, keep the batch going (exit 3)."""
    import traceback

    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    err = InputError(path, f"internal error of phantom audit ({type(exc).__name__}: {exc}{where}); please report "
                           "it with this file")
    return InputReport(path, error=err, internal=True)


def audit(paths: Sequence[str], *, reward_fns: Sequence[str] = (), shaped: bool | None = None,
          version: str = "0.9.1", entrypoint: str | None = None, kind: str | None = None, merge: bool = False,
          all_same: AllSame | None = None, exposure: str | None = None, data_source: str | None = None,
          fail_on: str = "warning", ignore: Sequence[str] = (), trl_version: str | None = None,
          skip_non_trainer: bool = False, probe_timeout: float | None = None) -> Report:
    """Audit each config (or, with ``merge``, all of them layered as one run)."""
    report = Report([], version=version, fail_on=fail_on)
    try:
        loaded = [load_reward_fn(t, timeout=probe_timeout) for t in reward_fns]
        if exposure is not None:
            all_same = _measure(exposure)
    except InputError as exc:
        report.inputs.append(InputReport(exc.path, error=exc))
        return report
    docs: list[ConfigDoc | InputReport] = []
    for p in paths:
        try:
            docs += read_configs(p, kind=kind)
        except InputError as exc:
            if skip_non_trainer and exc.message.startswith(("no trainer command found", "not a verl or TRL config")):
                report.skipped.append((p, exc.message))
                continue
            docs.append(InputReport(p, error=exc))
        except Exception as exc:  # noqa: BLE001 - a reader bug must not empty the batch
            docs.append(_internal(p, exc))
    if merge and all(isinstance(d, ConfigDoc) for d in docs) and len(docs) > 1:
        first = docs[0]
        try:
            for d in docs[1:]:
                first = first.merged(d)  # type: ignore[union-attr]
            docs = [first]
        except InputError as exc:
            docs = [InputReport(exc.path, error=exc)]
    for d in docs:
        if isinstance(d, InputReport):
            report.inputs.append(d)
            continue
        try:
            rep = audit_doc(d, version=version, entrypoint=entrypoint, reward_fns=loaded, shaped=shaped,
                            all_same=all_same, data_source=data_source, trl_version=trl_version,
                            probes_out=report.probes, probe_timeout=probe_timeout)
        except InputError as exc:
            if skip_non_trainer and exc.message.startswith("a TRL config without GRPO settings"):
                report.skipped.append((d.path, exc.message))
                continue
            rep = InputReport(d.path, d.kind, d.form, error=exc, label=d.label, read=d.read)
        except Exception as exc:  # noqa: BLE001
            rep = _internal(d.path, exc)
        rep.findings = [f for f in rep.findings if f.rule not in ignore]
        report.inputs.append(rep)
    return report


def main(argv: list[str] | None = None) -> int:
    """``phantom audit``'s command line (:mod:`phantom.audit.command`)."""
    from phantom.audit.command import main as _main

    return _main(argv)
