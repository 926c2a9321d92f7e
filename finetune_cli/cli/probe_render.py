"""``results.md`` of a probe run: the stage x task matrix and what it says, as Markdown."""

from __future__ import annotations

from typing import Any


def markdown_table(results: dict[str, Any]) -> str:
    tasks = results["tasks"]
    lines = [f"# probe {results['mode']}: linear-probe accuracy (stage x task)", ""]
    lines.append("| variant | stage | " + " | ".join(tasks) + " |")
    lines.append("|---|---|" + "---|" * len(tasks))
    for label, v in results["variants"].items():
        for stage, row in zip(results["stages"], v["matrix"], strict=False):
            lines.append(f"| {label} | {stage} | " + " | ".join(f"{x:.4f}" for x in row) + " |")
    lines.append("")
    for label, v in results["variants"].items():
        if "degradation" in v:
            lines.append(f"- {label}: degradation (after own stage - final) "
                         + ", ".join(f"{t} {d:+.4f}" for t, d in v["degradation"].items())
                         + f"; mean over earlier tasks {v['mean_degradation_earlier']:+.4f}")
        if "delta_vs_pretrained" in v:
            lines.append(f"- {label}: fine-tuned - pretrained "
                         + ", ".join(f"{t} {d:+.4f}" for t, d in v["delta_vs_pretrained"].items()))
    return "\n".join(lines) + "\n"
