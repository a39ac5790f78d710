#!/usr/bin/env bash
# The course on a GPU, in one run of about 9 minutes (docs/gpu.md):
#   1. the machine: GPU, driver, PyTorch;
#   2. every CUDA test (pytest -k cuda: the `cuda` marker and the [cuda] parameters), 150 s at most;
#   3. every solution notebook, full run, with --device cuda and, at the same time on two other
#      cores, --device cpu (the 2-core baseline of the same machine), 390 s at most for each side;
#   4. one table: each notebook's wall seconds on both, the ratio, and the cells that raised.
#
#   benchmarks/gpu_check.sh [--dry-run]
#
# For a machine with PyTorch and pytest but no Jupyter: the kernel's packages come as wheels in
# .whl/ (docs/gpu.md says how to fetch them), installed into /tmp/site first. Everything it keeps
# is written under $OUT (a temporary folder when $OUT is unset): summary.txt (the table),
# env.txt, tests.log, notebooks-cuda.log, notebooks-cpu.log, notebook_runs.json.
# --dry-run checks the script where there is no GPU: the CUDA tests are only collected, and
# notebook 03 alone runs on the CPU side ($NOTEBOOKS overrides which notebooks run).
set -u
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$(mktemp -d)}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
echo "gpu_check: writing to $OUT"

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_check: the carried wheels did not install" | tee "$OUT/summary.txt"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{   date -u +"%Y-%m-%d %H:%M UTC"
    nvidia-smi -L 2>&1 || echo "no nvidia-smi"
    "$PY" -c "import sys, torch; print('Python', sys.version.split()[0], '| PyTorch', torch.__version__, '| CUDA',
torch.version.cuda, '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
    nproc; uptime
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ $DRY = 0 ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: PyTorch sees no CUDA device here (--dry-run checks the script without one)" | tee "$OUT/summary.txt"
    exit 2
fi

# 2. the CUDA tests
tests_args=(-m pytest -p no:cacheprovider -p no:xdist -q --continue-on-collection-errors -k cuda tests/unit tests/specs)
[ $DRY = 1 ] && tests_args+=(--collect-only)
timeout 150 "$PY" "${tests_args[@]}" > "$OUT/tests.log" 2>&1
tests_rc=$?
echo "CUDA tests: exit status $tests_rc ($(tail -n 1 "$OUT/tests.log"))"

# 3. the notebooks, both devices at once on separate cores (the CPU side on two, as a laptop)
if [ -n "${NOTEBOOKS:-}" ]; then
    read -r -a names <<< "$NOTEBOOKS"
elif [ $DRY = 1 ]; then
    names=(03_self_attention)
else
    names=($(cd solutions && ls -d [0-9][0-9]_*))
fi
cores=$(nproc)
run_side() {  # device, cpu list, deadline (s): one notebook_times.py per notebook, so that a cut keeps the rest
    local device=$1 cpus=$2 deadline=$(( SECONDS + $3 )) name left
    for name in "${names[@]}"; do
        left=$(( deadline - SECONDS ))
        if [ $left -le 5 ]; then echo "$name: not run, out of time"; continue; fi
        taskset -c "$cpus" timeout "$left" "$PY" benchmarks/notebook_times.py --device "$device" \
            --json "$WORK/$device-$name.json" "$name" || echo "$name: exit status $?"
    done
}
if [ $DRY = 1 ]; then
    run_side cpu 0-$(( cores > 1 ? 1 : 0 )) 300 > "$OUT/notebooks-cpu.log" 2>&1
    echo "(dry run: no CUDA side)" > "$OUT/notebooks-cuda.log"
else
    run_side cpu 0-1 390 > "$OUT/notebooks-cpu.log" 2>&1 &
    cpu_side=$!
    run_side cuda 2-$(( cores - 1 )) 390 > "$OUT/notebooks-cuda.log" 2>&1
    wait $cpu_side
fi

# 4. the table
"$PY" - "$WORK" "$OUT" "$tests_rc" "${names[@]}" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path

work, out, tests_rc, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
runs = {}
for device in ("cuda", "cpu"):
    for name in names:
        f = work / f"{device}-{name}.json"
        if f.is_file():
            run = json.loads(f.read_text())[name]
            run.pop("printed", None)  # (kept short: the logs hold what each printed)
            runs.setdefault(name, {})[device] = run
(out / "notebook_runs.json").write_text(json.dumps(runs, indent=1))
print((out / "env.txt").read_text().strip())
print(f"CUDA tests: exit status {tests_rc} (tests.log)")
print(f"\n{'notebook':<30}{'cuda s':>8}{'cpu s':>8}{'cuda/cpu':>10}   cells that raised (cuda, cpu)")
total = {"cuda": 0.0, "cpu": 0.0}
for name in names:
    got = runs.get(name, {})
    secs = {d: got[d]["seconds"] if d in got else None for d in ("cuda", "cpu")}
    shown = [f"{s:>8.1f}" if s is not None else f"{'-':>8}" for s in secs.values()]
    ratio = f"{secs['cuda'] / secs['cpu']:>10.2f}" if None not in secs.values() else f"{'-':>10}"
    raised = ", ".join(str(got[d]["errors"]) if d in got else "-" for d in ("cuda", "cpu"))
    print(f"{name:<30}{shown[0]}{shown[1]}{ratio}   {raised}")
    for d, s in secs.items():
        total[d] += s or 0.0
print(f"{'all (of those that ran)':<30}{total['cuda']:>8.1f}{total['cpu']:>8.1f}")
print("quality per notebook: notebooks-cuda.log and notebooks-cpu.log")
EOF
rm -rf "$WORK"
