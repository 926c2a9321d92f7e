"""Multi-process scaling of `finetune train` on the CPU: sentences/s of 1 vs N processes at the same
global batch.

Each configuration is the real CLI (`torchrun --standalone --nproc_per_node P -m finetune_cli train`)
on the embedded all-MiniLM-L6-v2 + ce head, the shipped quickstart sentences (repeated to --n rows),
max length 64, global batch 32 (32/P per process), no evaluation, no checkpoint until the end. The
figure is the run's own `samples_per_second` (summary.json: optimizer-step time only, so start-up,
tokenising and the final save are excluded), the median of --repeats runs.

    python bench/scaling.py [--procs 2] [--steps 30] [--repeats 3] [--device cpu|cuda]

Configurations: 1 process x T threads (T = all cores: what one process gets from the machine),
P processes x T/P threads each (the same cores split), and 1 process x T/P threads (the per-process
share, the base of the efficiency figure).

    scaling efficiency = sps(P processes) / (P * sps(1 process with T/P threads))
    speed-up vs one process = sps(P processes) / sps(1 process with T threads)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "finetune_cli" / "resources" / "quickstart"


def make_data(n: int, out: Path) -> Path:
    rows = (QUICKSTART / "train.tsv").read_text().splitlines()
    body = rows[1:]
    f = out / "train.tsv"
    f.write_text("\n".join([rows[0]] + [body[i % len(body)] for i in range(n)]) + "\n")
    return f


def run(procs: int, threads: int, steps: int, batch: int, data: Path, out: Path, device: str, model: str) -> float:
    name = f"p{procs}t{threads}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
           "-m", "finetune_cli", "train", "-r", "quickstart", f"model.name={model}", f"data.train={data}", "~data.eval",
           "model.max_length=64", f"train.batch_size={batch // procs}", f"train.max_steps={steps}",
           "train.eval_every=100000", "train.save_every=100000", "train.log_every=100000",
           f"output.dir={out}", f"output.name={name}", "--overwrite", "--device", device,
           "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nfailed:\n{res.stderr[-3000:]}")
    return json.loads((out / name / "summary.json").read_text())["samples_per_second"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="cores to use in all")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="global batch")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="embedded")
    a = ap.parse_args()
    per = max(1, a.threads // a.procs)
    configs = [(1, a.threads), (a.procs, per), (1, per)]
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(a.n, Path(tmp))
        sps: dict[tuple[int, int], list[float]] = {c: [] for c in configs}
        for _ in range(a.repeats):  # interleaved, so a load change hits every configuration alike
            for p, t in configs:
                sps[(p, t)].append(run(p, t, a.steps, a.batch, data, Path(tmp) / "runs", a.device, a.model))
    med = {k: statistics.median(v) for k, v in sps.items()}
    print(f"global batch {a.batch}, {a.steps} steps, median of {a.repeats}, device {a.device}, "
          f"load average after: {os.getloadavg()[0]:.2f}")
    for (p, t), v in med.items():
        print(f"  {p} process(es) x {t} thread(s): {v:8.1f} sentences/s   runs: "
              f"{', '.join(f'{x:.1f}' for x in sps[(p, t)])}")
    eff = med[(a.procs, per)] / (a.procs * med[(1, per)])
    up = med[(a.procs, per)] / med[(1, a.threads)]
    print(f"scaling efficiency {eff:.2f} (vs {a.procs} x one {per}-thread process); "
          f"speed-up vs one {a.threads}-thread process {up:.2f}x")


if __name__ == "__main__":
    main()
