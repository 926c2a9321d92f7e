"""Train the same recipe with two checkouts of finetune and compare what they leave: every weight of
``final/`` bit for bit, and ``metrics.jsonl`` record for record (timing and memory fields aside).
With ``--kill-after N`` the first checkout's run is killed (SIGKILL) once ``checkpoint-N`` exists and
the second checkout resumes it, so a checkpoint written by one version must resume exactly in the
other; it is compared against an uninterrupted run of the second checkout.

    python scripts/compare_runs.py OLD_ROOT NEW_ROOT [--kill-after 4] [-- key=value ...]

Each ROOT is a checkout whose ``finetune_cli`` is imported (PYTHONPATH); the Python running this
script runs both. Exit 0 when identical; otherwise the differences are printed and the exit is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMALL = ["train.max_steps=12", "train.eval_every=4", "train.save_every=4", "train.log_every=2",
         "model.max_length=64"]
NOISE = ("samples_per_s", "gpu_mem_gb", "gpu_mem_peak_gb")


def train(root: Path, out: Path, name: str, overrides: list[str], kill_after: int | None = None) -> None:
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "FINETUNE_CACHE": str(out / ".cache")}
    cmd = [sys.executable, "-m", "finetune_cli", "train", "-r", "quickstart", f"output.dir={out}",
           f"output.name={name}", *SMALL, *overrides, "-q"]
    p = subprocess.Popen(cmd, env=env, cwd=root)
    if kill_after is None:
        if p.wait() != 0:
            sys.exit(f"{' '.join(cmd)} failed ({p.returncode})")
        return
    ck = out / name / f"checkpoint-{kill_after}"
    while p.poll() is None and not ck.is_dir():
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()


def weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return {f.relative_to(run).as_posix() + ":" + k: v for f in sorted((run / "final").rglob("*.safetensors"))
            for k, v in load_file(str(f)).items()}


def records(run: Path) -> list[dict]:
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return [{k: v for k, v in r.items() if k not in NOISE} for r in recs]


def compare(a: Path, b: Path) -> list[str]:
    wa, wb = weights(a), weights(b)
    bad = [f"weights: keys differ ({sorted(set(wa) ^ set(wb))[:3]})"] if wa.keys() != wb.keys() else []
    bad += [f"weight {k} differs (max |d| {(wa[k].float() - wb[k].float()).abs().max().item():.3g})"
            for k in sorted(set(wa) & set(wb)) if not (wa[k].dtype == wb[k].dtype and bool((wa[k] == wb[k]).all()))]
    ra, rb = records(a), records(b)
    bad += [f"metrics.jsonl: {len(ra)} records vs {len(rb)}"] if len(ra) != len(rb) else []
    bad += [f"metrics.jsonl record {i}: {x} vs {y}" for i, (x, y) in enumerate(zip(ra, rb, strict=False)) if x != y]
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--kill-after", type=int, default=None)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        train(a.old.resolve(), out, "old", a.overrides)
        train(a.new.resolve(), out, "new", a.overrides)
        bad = compare(out / "old", out / "new")
        print(f"uninterrupted, old vs new: {'identical' if not bad else 'DIFFERENT'}")
        if a.kill_after is not None:
            train(a.old.resolve(), out, "resumed", a.overrides, kill_after=a.kill_after)
            train(a.new.resolve(), out, "resumed", a.overrides)
            more = compare(out / "new", out / "resumed")
            print(f"killed after checkpoint-{a.kill_after} (old), resumed (new), vs new uninterrupted: "
                  f"{'identical' if not more else 'DIFFERENT'}")
            bad += more
        for line in bad[:20]:
            print("  " + line)
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
