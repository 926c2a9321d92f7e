"""Quality gates for CI scripts: ``--expect 'accuracy>=0.85'`` on ``finetune eval`` and ``train``.

An expectation is ``METRIC OP BOUND`` with OP one of ``>=``, ``<=``, ``>``, ``<``. A malformed one
is a usage error (exit 2) before anything runs; one naming a metric the evaluation does not
compute is exit 2 too, naming the metrics that exist; a failed gate ends the command with
:data:`GATE_EXIT` (4) and one line per command: each failed metric, its value and the bound.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from finetune_cli.errors import FinetuneError, did_you_mean

GATE_EXIT = 4
OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
_SPEC = re.compile(r"\s*([A-Za-z_][\w/.-]*)\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*")


class GateFailed(FinetuneError):
    """A metric missed its bound."""

    exit_code = GATE_EXIT


@dataclass(frozen=True)
class Expectation:
    metric: str
    op: str
    bound: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_expectations(specs: Sequence[str]) -> list[Expectation]:
    out = []
    for s in specs:
        m = _SPEC.fullmatch(s)
        if not m:
            raise FinetuneError(f"--expect {s!r}: write METRIC>=BOUND (or <=, >, <), e.g. 'accuracy>=0.85'")
        out.append(Expectation(m.group(1), m.group(2), float(m.group(3))))
    return out


def check_known(expectations: Sequence[Expectation], available: Sequence[str], where: str = "") -> None:
    """Exit-2 error for an expectation on a metric that is not computed."""
    for e in expectations:
        if e.metric not in available:
            # a prefix first (`acc` -> accuracy, not mcc), then the closest spelling
            prefixed = [m for m in available if m.startswith(e.metric)]
            hint = f"; did you mean `{prefixed[0]}`?" if prefixed else did_you_mean(e.metric, available, cutoff=0.5)
            raise FinetuneError(f"--expect {e}: no metric `{e.metric}`{where} (have: {', '.join(available)}){hint}")


def failures(expectations: Sequence[Expectation], metrics: Mapping[str, float]) -> list[str]:
    """Text of each failed gate, e.g. ``accuracy = 0.8123, expected >= 0.85``."""
    return [f"{e.metric} = {metrics[e.metric]:.4f}, expected {e.op} {e.bound:g}"
            for e in expectations if not OPS[e.op](float(metrics[e.metric]), e.bound)]


def enforce(expectations: Sequence[Expectation], metrics: Mapping[str, float], ui=None, where: str = "") -> None:
    """Check every expectation; raise :class:`GateFailed` (one line) if any fails."""
    if not expectations:
        return
    check_known(expectations, list(metrics), where)
    failed = failures(expectations, metrics)
    if failed:
        raise GateFailed(f"quality gate failed{where}: " + "; ".join(failed))
    if ui is not None:
        ui.log(f"quality gates passed{where}: " + ", ".join(
            f"{e.metric} = {float(metrics[e.metric]):.4f} {e.op} {e.bound:g}" for e in expectations))


def enforce_on_run(expectations: Sequence[Expectation], summary: Mapping, ui=None, where: str = "") -> None:
    """Check ``--expect`` on a training run's final evaluation (its ``summary.json``)."""
    if not expectations:
        return
    final = summary.get("final_eval") or {}
    if not final:
        raise FinetuneError(f"--expect: run {summary.get('run_dir')} has no final evaluation (no evaluation data)")
    enforce(expectations, final, ui, where)
