"""bench/train_throughput.py at smoke size (the tiny-model proxy on synthetic sentences): a runner
that fails is reported and left out while the others run to their table; ``--profile`` profiles each
runner's warm-up run and prints where the host's time goes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_train_bench_leaves_out_a_failing_runner_and_profiles_the_warm_up(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("FINETUNE_DATA_DIR", None)  # synthetic sentences
    # finetune_graphs needs a CUDA GPU: on the CPU its worker fails (train.cuda_graphs=on is refused)
    p = subprocess.run([sys.executable, str(REPO / "bench" / "train_throughput.py"), "--proxy", "--n", "256",
                        "--repeats", "1", "--skip", "2", "--runners", "finetune,finetune_graphs,hf_grouped",
                        "--profile"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    err = p.stderr
    assert "runner finetune_graphs failed" in err and "train.cuda_graphs=on" in err
    table = err[err.index("runner     "):]
    rows = [ln.split()[0] for ln in table.splitlines()[1:] if ln.strip() and not ln.startswith((" ", "profile"))]
    assert rows[:2] == ["finetune", "hf_grouped"] and "finetune_graphs" not in table.split("profile")[0]
    for r in ("finetune", "hf_grouped"):
        assert f"profile {r}" in err and f"host {r}" in err
    assert "aten::" in err[err.index("host finetune"):]  # the host's top ops are named
