#!/usr/bin/env bash
# What a new user gets: clone this checkout's committed HEAD into a temporary folder, run the
# README's first command there exactly as written (fresh venv, install, `sara demo`: seed 0), then
# `sara demo --seed N` for each further seed in that venv, and record each run's figures, wall
# time (the first includes the install) and the machine load in bench/results/demo_fresh.txt.
# Usage, from the project root:  bash bench/demo_fresh.sh [SEED ...]   (default: 1 2)
set -euo pipefail
root=$(pwd)
seeds=("${@:-1 2}")
read -r -a seeds <<< "${seeds[*]}"
work=$(mktemp -d)
git clone -q "$root" "$work/repo"
cd "$work/repo"
commit=$(git rev-parse --short HEAD)
line=$(awk '/^```(bash|sh)/{f=1;next} /^```/{if(f)exit} f && /sara demo/{print; exit}' README.md)
[[ -n $line ]] || { echo "README: no first command that runs sara demo" >&2; exit 1; }
out="$root/bench/results/demo_fresh.txt"
report() {  # seed, wall seconds, summary.json, what ran
  python3 - "$@" <<'PY'
import json, sys
seed, wall, path, what = sys.argv[1:5]
s = json.load(open(path))
acc, cmp = s["accuracy"], s.get("comparison") or {}
sara, ds = s["arms"]["sara"], s["arms"].get("dynamic_sampling")
n = acc["n"]
se = (acc["standard_error_before"] ** 2 + acc["standard_error_after"] ** 2) ** 0.5
gain = acc["after_rl"] - acc["before_rl"]
print(f"seed {seed}: {what}: {wall} s")
print(f"  held-out greedy accuracy (n={n}): {100 * acc['before_rl']:.1f}% -> SARA "
      f"{100 * acc['after_rl']:.1f}% ({100 * gain:+.1f} points, {gain / se:.1f} s.e. of the "
      f"difference)" + (f"; DS {100 * ds['accuracy_after']:.1f}%" if ds else ""))
if ds:
    print(f"  rollouts spent: SARA {sara['rollouts_spent']:,}, DS {ds['rollouts_spent']:,}")
    fmt = lambda v: "not reached" if v is None else f"{v:,.0f}"
    for name in ("ds_final", "halfway"):
        got = cmp[f"rollouts_to_{name}"]
        ratio = "" if got["ratio"] is None else f" ({got['ratio']:.2f}x)"
        print(f"  rollouts to {100 * cmp['targets'][name]:.1f}% ({name}): SARA {fmt(got['sara'])}"
              f"{ratio}, DS {fmt(got['ds'])}")
    print(f"  rollouts per mixed group: SARA {sara['rollouts_per_mixed_group']:.1f}, DS "
          f"{ds['rollouts_per_mixed_group']:.1f}; RL wall: SARA {sara['seconds']:.0f} s, DS "
          f"{ds['seconds']:.0f} s")
print(f"  warm start: {s['warm_start']['source']} {s['warm_start'].get('sha256', '')[:16]}")
PY
}
{
  echo "sara demo from a fresh clone (bench/demo_fresh.sh)"
  echo "date:    $(date -u '+%Y-%m-%d %H:%M:%S') UTC"
  echo "code:    $commit"
  echo "machine: $(uname -m), $(nproc) CPUs, $(python3 --version 2>&1); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "first:   $line"
} > "$out.tmp"
start=$(date +%s)
bash -c "$line" > "$work/seed0.log" 2>&1 || { tail -40 "$work/seed0.log"; exit 1; }
wall=$(( $(date +%s) - start ))
report 0 "$wall" sara-demo/summary.json "the README's first line, install included" >> "$out.tmp"
. .venv/bin/activate
for seed in "${seeds[@]}"; do
  start=$(date +%s)
  sara demo --seed "$seed" --out "$work/seed$seed" > "$work/seed$seed.log" 2>&1 \
    || { tail -40 "$work/seed$seed.log"; exit 1; }
  wall=$(( $(date +%s) - start ))
  report "$seed" "$wall" "$work/seed$seed/summary.json" "sara demo --seed $seed" >> "$out.tmp"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); logs and outputs under $work" >> "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
