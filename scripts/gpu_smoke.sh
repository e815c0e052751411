#!/usr/bin/env bash
# The first thing to run on a machine with an NVIDIA GPU (docs/gpu.md): no network, no Docker, no
# install of this repo. It prints the environment (nvidia-smi, python, torch/CUDA, vLLM, and what
# is missing), builds a tiny random-weight Qwen2-architecture model here (nothing downloaded),
# starts `sara serve` (embedded Redis), an hf worker on the GPU (and a vLLM worker on the GPU when
# vllm imports), and runs `sara train` on the GPU for a few steps: fp32 master weights with bf16
# autocast, a token budget per micro-batch, gradient checkpointing. Then it prints each step's
# time, the trainer's memory estimate beside what its first step measured (on CUDA the check
# fails outside 0.5-2x), its measured peak GPU memory, the card's peak use, and whether the vLLM
# worker reloaded each version in place (no engine rebuild). With vLLM on the
# GPU it then runs bench/engine_time.py --quick there, DS and SARA at the service's defaults,
# and prints its table and each one's engine occupancy and effective groups per engine-second.
#
#   scripts/gpu_smoke.sh [--device auto|cuda|cpu] [--steps N (3 on cpu, 5 on cuda)] [--arch qwen2|gpt2]
#                        [--wheels DIR] [--no-vllm] [--timeout S] [--keep]
#
# --device auto (default) takes cuda when torch sees a GPU, else cpu (the CPU run is what CI
# does; it is the same code path with --device cpu). --wheels DIR (default: .whl if present)
# installs wheels for missing packages into a scratch folder first, no index: make them with
# scripts/gpu_smoke_wheels.sh. The log and summary.json go to $OUT when it is set (else a
# temporary folder, printed). Exit status: 0 ok, 1 a check failed, 3 a required package missing.
set -uo pipefail

DEVICE=auto STEPS="" ARCH=qwen2 WHEELS="" VLLM=1 TIMEOUT=240 KEEP=0 PY=${PYTHON:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --arch) ARCH=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --no-vllm) VLLM=0; shift ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sara-gpu-smoke.XXXXXX")
LOGS=${OUT:-$WORK/out}
mkdir -p "$LOGS"
exec > >(tee -a "$LOGS/gpu_smoke.log") 2>&1
T0=$(date +%s)
say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    [ "$KEEP" = 1 ] || rm -rf "$WORK/model" "$WORK/ckpt" "$WORK/data"
}
trap cleanup EXIT

say "gpu_smoke.sh in $ROOT, work dir $WORK, logs in $LOGS"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi || echo "nvidia-smi failed"
else
    echo "nvidia-smi: not found"
fi
if [ -z "$PY" ]; then
    for c in python3 python; do command -v "$c" >/dev/null && { PY=$(command -v "$c"); break; }; done
fi
[ -n "$PY" ] || { echo "no python3 on PATH"; exit 3; }
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
SMOKE=("$PY" "$ROOT/scripts/gpu_smoke.py")

say "environment"
"${SMOKE[@]}" env; rc=$?
if [ "$rc" = 3 ]; then
    [ -z "$WHEELS" ] && [ -d "$ROOT/.whl" ] && WHEELS=$ROOT/.whl
    if [ -n "$WHEELS" ]; then
        say "installing the carried wheels in $WHEELS into $WORK/site (no index, no deps)"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target "$WORK/site" "$WHEELS"/*.whl || { echo "wheel install failed"; exit 3; }
        export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
        "${SMOKE[@]}" env || exit 3
    else
        echo "required packages are missing and no wheels were given (--wheels DIR or .whl)"
        exit 3
    fi
elif [ "$rc" != 0 ]; then
    exit 1
fi

CUDA=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
case "$DEVICE" in
    auto) [ "$CUDA" = 1 ] && DEVICE=cuda || DEVICE=cpu ;;
    cuda*) [ "$CUDA" = 1 ] || { echo "--device $DEVICE but torch sees no GPU"; exit 1; } ;;
esac
[ -n "$STEPS" ] || { [ "$DEVICE" = cpu ] && STEPS=3 || STEPS=5; }
HAS_VLLM=0
if [ "$VLLM" = 1 ] && [ "$DEVICE" != cpu ] && "$PY" -c 'import vllm' >/dev/null 2>&1; then
    HAS_VLLM=1
fi
say "device=$DEVICE steps=$STEPS arch=$ARCH vllm_worker=$HAS_VLLM"

say "building the tiny model"
"${SMOKE[@]}" build "$WORK/model" --arch "$ARCH" || exit 1

PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
# small groups and batches, short completions: the point is the code path, not the learning
export SARA_MAX_TOKENS=8 SARA_LEASE_TTL_S=30
say "sara serve on $URL (k=4, 4 groups per batch, embedded Redis)"
"${SMOKE[@]}" cli serve --port "$PORT" --data-dir "$WORK/data" --group-size 4 --batch-size 4 \
    --tau-low 0.5 --log-level warning > "$LOGS/serve.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 120); do
    "$PY" -c "import httpx,sys; sys.exit(httpx.get('$URL/readyz').status_code != 200)" \
        2>/dev/null && break
    kill -0 "${PIDS[0]}" 2>/dev/null || { echo "sara serve exited:"; tail -20 "$LOGS/serve.log"; exit 1; }
    sleep 0.5
done
"${SMOKE[@]}" load "$URL" 64 || exit 1

[ "$DEVICE" = cpu ] && HF_DEV=cpu || HF_DEV=$DEVICE
say "hf worker on $HF_DEV"
"${SMOKE[@]}" worker --backend hf --model "$WORK/model" --url "$URL" --worker-id hf-0 \
    --capacity 32 --lease-wait 1 --flush-ms 20 --log-interval 10 \
    --option "device=$HF_DEV" --option threads=1 > "$LOGS/worker-hf.log" 2>&1 &
PIDS+=($!)
if [ "$HAS_VLLM" = 1 ]; then
    say "vLLM worker on $DEVICE (gpu_memory_utilization 0.2, weight_update=reload: a failed in-place reload fails here)"
    "${SMOKE[@]}" worker --backend vllm --model "$WORK/model" --url "$URL" --worker-id vllm-0 \
        --capacity 64 --lease-wait 1 --flush-ms 20 --log-interval 10 \
        --gpu-memory-utilization 0.2 --option weight_update=reload --option dtype=bfloat16 \
        --option max_model_len=256 --option enforce_eager=true > "$LOGS/worker-vllm.log" 2>&1 &
    PIDS+=($!)
    # the trainer starts once the engine is up, so every version it publishes is an in-place
    # reload (an engine started late would start on the newest checkpoint instead)
    for _ in $(seq 1 360); do
        grep -q "weight updates:" "$LOGS/worker-vllm.log" 2>/dev/null && break
        kill -0 "${PIDS[-1]}" 2>/dev/null || break
        sleep 0.5
    done
    grep "weight updates:" "$LOGS/worker-vllm.log" \
        || { echo "the vLLM worker did not start its engine:"; tail -30 "$LOGS/worker-vllm.log"; exit 1; }
else
    echo "vLLM worker: not run ($([ "$DEVICE" = cpu ] && echo 'device is cpu' || echo 'vllm does not import or --no-vllm'))"
fi

if command -v nvidia-smi >/dev/null && [ "$DEVICE" != cpu ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 \
        > "$LOGS/gpu-mem.csv" 2>/dev/null &
    PIDS+=($!)
fi

say "sara train on $DEVICE for $STEPS steps"
TRAIN_ARGS=(--model "$WORK/model" --url "$URL" --checkpoint-dir "$WORK/ckpt" --steps "$STEPS"
            --device "$DEVICE" --micro-batch-tokens 256 --gradient-checkpointing
            --checkpoint-every "$STEPS" --publish-every 1 --lr 1e-3 --threads 1
            --set batch_wait_s=10
            --report-to jsonl --logging-dir "$WORK/runs")  # $OUT: at most 8 files come back
timeout "$TIMEOUT" "${SMOKE[@]}" train "${TRAIN_ARGS[@]}" > "$LOGS/trainer.log" 2>&1
TRAIN_RC=$?
sleep 2  # let the workers load the last published version
cat "$LOGS/trainer.log"

say "summary"
"${SMOKE[@]}" summary "$LOGS" "$STEPS" "$HAS_VLLM" "$TRAIN_RC"
RC=$?

if [ "$HAS_VLLM" = 1 ]; then
    # the workers and the scheduler hold GPU memory: the bench starts its own engine and servers
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    PIDS=()
    say "engine time on $DEVICE (bench/engine_time.py --quick: DS and SARA at the service's defaults, the raw engine)"
    timeout "$TIMEOUT" "${SMOKE[@]}" bench engine_time --quick --policies ds,sara \
        --model "$WORK/model" --dtype bfloat16 --max-model-len 256 \
        --gpu-memory-utilization 0.5 --no-write \
        --json "$LOGS/engine_time.json" > "$LOGS/engine_time.log" 2>&1
    BENCH_RC=$?
    sed -n '/^SARA engine time/,$p' "$LOGS/engine_time.log"
    "${SMOKE[@]}" engine "$LOGS/engine_time.json"
    [ "$BENCH_RC" = 0 ] || { echo "engine time bench failed (exit $BENCH_RC):"; tail -30 "$LOGS/engine_time.log"; RC=1; }
fi
say "done (exit $RC); log: $LOGS/gpu_smoke.log"
exit $RC
