#!/usr/bin/env bash
# Training speed before and after a change, side by side: the same `dspark train` command run from two
# commits in turn (old, new, old, new, ...) on the same feature store, nothing else running. Each run
# trains STEPS steps into a fresh folder; its rate is the `steps_per_s` of the last row of its loss.csv
# (the last 20 steps: the first row also holds the warm-up). Writes runs.csv (one row per run) and prints
# the medians. Usage, from the repository root, after the feature store is built (`--features-only`):
#   OLD=c873a2c data/results/train-speed/ab.sh <dspark train flags without --out>
# Regenerates data/results/train-speed/runs.csv with
#   OLD=c873a2c REPS=2 STEPS=40 data/results/train-speed/ab.sh --drafter dspark --head markov --layers 2 \
#     --anchor-feature --shift-anchors --ce-label argmax --dtype bfloat16 --autocast bfloat16 --sources distill
set -euo pipefail
OLD=${OLD:?set OLD to the commit measured before}
REPS=${REPS:-2}
STEPS=${STEPS:-40}
HERE=$(pwd)
NEW=$(git rev-parse --short HEAD)
OLD_SHORT=$(git rev-parse --short "$OLD")
OUT=${OUT_CSV:-data/results/train-speed/runs.csv}
WORK=$(mktemp -d)
git worktree add --detach "$WORK/old" "$OLD" >/dev/null
trap 'git worktree remove --force "$WORK/old"; rm -rf "$WORK"' EXIT
echo "commit,rep,steps,steps_per_s,command" > "$OUT"
for rep in $(seq 1 "$REPS"); do
  for side in old new; do
    if [ "$side" = old ]; then src="$WORK/old"; commit=$OLD_SHORT; else src="$HERE"; commit=$NEW; fi
    run="$WORK/run-$side-$rep"
    (cd "$src" && PYTHONPATH="$src" "$HERE/.venv/bin/python" -m dspark_core.cli train "$@" --steps "$STEPS" \
      --save-every "$STEPS" --out "$run" > "$run.log" 2>&1) || { tail -20 "$run.log"; exit 1; }
    rate=$(tail -1 "$run/loss.csv" | awk -F, '{print $NF}')
    echo "$commit,$rep,$STEPS,$rate,\"dspark train $* --steps $STEPS\"" >> "$OUT"
    echo "$side ($commit) rep $rep: $rate steps/s"
  done
done
"$HERE/.venv/bin/python" - "$OUT" <<'PY'
import sys, pandas as pd
runs = pd.read_csv(sys.argv[1])
med = runs.groupby("commit", sort=False)["steps_per_s"].median()
print(med.to_string()); print(f"ratio (last over first): {med.iloc[-1] / med.iloc[0]:.2f}x")
PY
