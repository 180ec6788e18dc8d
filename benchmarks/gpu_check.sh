#!/usr/bin/env bash
# schedsim's GPU path on a machine with ONE GPU, in under 5 minutes:
#   1. CUDA-event timing: the replay's clock orders GPU work on the host clock;
#   2. calibration on the GPU: 2 ranks share the GPU (P2P through gloo, staged via host
#      memory; NCCL needs one GPU per rank), op costs measured with CUDA events;
#   3. a 2-rank replay on the shared GPU with the gradient check, profiled with
#      torch.profiler (CPU + CUDA activity), both errors printed (replay --compare);
#   4. the profile imported and checked (import-trace, check-trace): both errors again,
#      and the per-rank bubble breakdown;
#   5. the contended calibration (steps of the program on the shared GPU) for comparison.
# Everything goes to ONE report, OUT_DIR/report.txt (and the console); the JSON files
# beside it.
# Usage: bash benchmarks/gpu_check.sh [OUT_DIR]     (DEVICE=cpu runs the same on the CPU)
# Status: written and run on the CPU only (DEVICE=cpu); the CUDA and NCCL paths are
# untested until this script has been run on a GPU machine (docs/traces.md).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
OUT=${1:-$(mktemp -d -t schedsim-gpu-XXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-python}
exec > >(tee "$OUT/report.txt") 2>&1
echo "schedsim gpu_check: DEVICE=$DEVICE, $(date -u), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
SC=schedules/replay-1f1b.toml
SET=(--set "device=$DEVICE" --set hidden=512 --set seq=64 --set steps=3)
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }

step "1. CUDA-event clock on $DEVICE"
timeout 60 "$PY" - "$DEVICE" <<'EOF'
import sys, torch
from schedsim.replay.timing import Clock
dev = sys.argv[1]
if dev == "cuda":
    assert torch.cuda.is_available(), "torch sees no CUDA GPU"
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "CUDA", torch.version.cuda)
n = 4096 if dev == "cuda" else 256
clock = Clock(dev)
a = clock.stamp()
x = torch.randn(n, n, device=dev)
for _ in range(10):
    x = x @ x.T / n
b = clock.stamp()
clock.sync()
ta, tb = clock.resolve(a), clock.resolve(b)
assert ta < tb, (ta, tb)
print(f"10 matmuls {n}^2: {(tb - ta) / 1e6:.3f} ms on the {dev} clock")
EOF

step "2. calibration on $DEVICE (benchmarks: ops timed by CUDA events, ping-pong, launches)"
timeout 120 "$PY" -m schedsim calibrate "$SC" "${SET[@]}" --repeats 3 --no-contended \
    --out "$OUT/costs.toml"

step "3. replay --compare on $DEVICE, 2 ranks sharing it, profiled"
timeout 150 "$PY" -m schedsim replay "$SC" "${SET[@]}" --check-grads --compare \
    --out-dir "$OUT" --profile-dir "$OUT/prof"

step "4. the profile imported and checked"
timeout 60 "$PY" -m schedsim check-trace "$OUT"/prof/rank0.json "$OUT"/prof/rank1.json \
    --name gpu-trace --json "$OUT/trace-errors.json"

step "5. contended calibration on $DEVICE (3 steps of the program)"
timeout 120 "$PY" -m schedsim calibrate "$SC" "${SET[@]}" --repeats 3 --contended \
    --out "$OUT/costs-contended.toml"

step "done: outputs in $OUT, this report in $OUT/report.txt"
cat "$OUT"/*-errors.json
