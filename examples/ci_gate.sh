#!/usr/bin/env bash
# CI quality gate: train the quickstart, evaluate it, and fail the job when it regresses
# (the three lines below: settings, train, evaluate + gate).
# Exit codes: 0 pass, 4 a gate failed (one line names the metric, its value and the bound),
# 2 bad input, 3 training failed. Extra arguments are recipe overrides for `finetune train`.
set -euo pipefail
RUNS="${RUNS:-runs}"; MIN_ACCURACY="${MIN_ACCURACY:-0.90}"; MAX_ECE="${MAX_ECE:-0.10}"

finetune train -r quickstart output.dir="$RUNS" "$@" --quiet
finetune eval "$RUNS/quickstart" --no-figures --quiet --expect "accuracy>=$MIN_ACCURACY" --expect "ece<=$MAX_ECE"
