# Train byte-level RWKV-7s at released widths on a GPU, then export, gate and score each under
# each recipe on the same machine's CPUs (benchmarks/trained_released_width.py).
#
#   bash benchmarks/trained_released_width.sh train     # per width: probe, train, start its recipes (detached)
#   bash benchmarks/trained_released_width.sh collect   # wait for the recipes, merge each width's figures
#
# Both phases write what they have under $OUT and end by $PHASE_S seconds, so each fits one call
# of a machine lent per call (the second call must start while the first's machine is still
# held); the recipes run detached (setsid) across the two. Widths train one after the other on
# the GPU, the first's recipes already running on the CPUs while the next trains. A recipe is
# one chain of processes, one core each (the Core AI runtime is single-threaded): export (no
# gate), then side by side its gate and SEGMENTS held-out processes, each a consecutive piece of
# the first HELD_OUT bytes of the held-out text teacher-forced from a zero state (a decode call
# of a 0.1B-wide 16-bit bundle takes seconds here, so one stream of 241 bytes does not fit).
#
# Settings (environment): WIDTHS (rwkv7-0.1b, rwkv7-0.4b: the released shapes, L12 C768 and L24
# C1024 with their LoRA ranks, ssmport/models/rwkv7/config.py; test: L2 C64, a smoke test),
# TRAIN_S_<width> e.g. TRAIN_S_0_1b (seconds of training: a timed probe sizes the step count),
# CTX (bytes per training window), RECIPES, HELD_OUT, DATA (train.u16 + validation.u16, or their
# .xz), WORK (scratch), PY (python), DEVICE, PHASE_S.
set -u
PHASE=${1:?train, collect or recipe}
HERE=$(cd "$(dirname "$0")" && pwd)
TOOLS=${TOOLS:-$HERE/../tools}
PY=${PY:-python3}
WORK=${WORK:-/tmp/trw}
OUT=${OUT:-$WORK/out}
DATA=${DATA:-$WORK/data}
DEVICE=${DEVICE:-cuda}
WIDTHS=${WIDTHS:-rwkv7-0.1b rwkv7-0.4b}
CTX=${CTX:-256}
PHASE_S=${PHASE_S:-570}
RECIPES=${RECIPES:-fp16 int8keepproj int4keepproj auto}
HELD_OUT=${HELD_OUT:-241}
TRW="$HERE/trained_released_width.py"
export PYTHONUNBUFFERED=1
mkdir -p "$WORK/data" "$OUT"

# A width's model flags (tools/train_tiny.py), auto's size budget (about 1 byte a parameter,
# between int4keepproj's asset and int8keepproj's), held-out segments per recipe, training seconds.
settings() {
    case $1 in
        rwkv7-0.1b) echo "${TRAIN_S_0_1b:-100} 90MB 4 --layers 12 --width 768 --ffn 3072 --decay-lora 64 --a-lora 64 --v-lora 32 --gate-lora 128" ;;
        rwkv7-0.4b) echo "${TRAIN_S_0_4b:-150} 315MB 2 --layers 24 --width 1024 --ffn 4096 --decay-lora 64 --a-lora 64 --v-lora 32 --gate-lora 160" ;;
        test) echo "${TRAIN_S_test:-5} 700KB 2 --layers 2 --width 64 --ffn 256 --head 32 --decay-lora 32 --a-lora 32 --v-lora 32 --gate-lora 32" ;;
        *) echo "unknown width $1" >&2; return 1 ;;
    esac
}

if [ "$PHASE" = recipe ]; then  # recipe WIDTH RECIPE BUDGET SEGMENTS: one recipe's chain (detached)
    W=$2 R=$3 BUDGET=$4 SEGMENTS=$5
    RES="$WORK/$W/res" WEIGHTS=(--weights "$WORK/$W/run/rwkv7-pydoc.pth" --bundle "$WORK/$W/bundles/$R")
    nice -n 5 "$PY" "$TRW" export "${WEIGHTS[@]}" --recipe "$R" --budget "$BUDGET" --json "$RES/$R.export.json" || exit 1
    nice -n 5 "$PY" "$TRW" gate "${WEIGHTS[@]}" --json "$RES/$R.gate.json" &
    for ((k = 0; k < SEGMENTS; k++)); do
        nice -n 5 "$PY" "$TRW" held-out "${WEIGHTS[@]}" --held-out-steps "$HELD_OUT" --segments "$SEGMENTS" \
            --segment "$k" --npz "$RES/$R.held$k.npz" &
    done
    wait
    exit 0
fi

collect() {  # each width's figures so far, its training log, and its logs in one file
    for w in $WIDTHS; do
        [ -f "$WORK/$w/run/train_log.jsonl" ] || continue
        cp "$WORK/$w/run/train_log.jsonl" "$OUT/$w.train_log.jsonl"
        "$PY" "$TRW" merge "$WORK/$w/res" --train-log "$WORK/$w/run/train_log.jsonl" --json "$OUT/$w.json"
        tail -n +1 "$WORK/$w/train_stdout.txt" "$WORK/$w"/res/*.log > "$OUT/$w.log.txt" 2>/dev/null
    done
}

wait_recipes() {  # until every recipe process ended or PHASE_S
    while pgrep -f "trained_released_width.py (export|gate|held-out)" > /dev/null && [ "$SECONDS" -lt "$PHASE_S" ]; do
        sleep 5
    done
    pgrep -fa "trained_released_width.py (export|gate|held-out)" | sed 's/^/still running: /'
}

if [ "$PHASE" = collect ]; then
    wait_recipes
    collect
    echo "collect phase ${SECONDS}s"
    exit 0
fi

for f in train.u16 validation.u16; do
    [ -f "$DATA/$f" ] && cp "$DATA/$f" "$WORK/data/$f" || xz -dc "$DATA/$f.xz" > "$WORK/data/$f" || exit 1
done
for w in $WIDTHS; do
    read -r TRAIN_S BUDGET SEGMENTS DIMS < <(settings "$w") || exit 1
    mkdir -p "$WORK/$w/run" "$WORK/$w/res" "$WORK/$w/bundles"
    # Probe: the memory and time of one training step at 8 windows, then at the batch that fills
    # about 70% of the GPU; the step count is what TRAIN_S allows at that batch.
    read -r BATCH STEPS < <(cd "$TOOLS" && "$PY" - "$DEVICE" "$TRAIN_S" "$CTX" $DIMS <<'EOF'
import argparse, sys, time
import torch
import torch.nn.functional as F
from rwkv7_trainable import RWKV7, Dims
device, seconds, ctx = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
p = argparse.ArgumentParser()
for f in Dims().to_json():
    p.add_argument(f"--{f.replace('_', '-')}", type=int, default=getattr(Dims(), f))
model = RWKV7(Dims(**vars(p.parse_args(sys.argv[4:])))).to(device)
def step(batch):
    if device.startswith("cuda"):
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    x = torch.randint(0, model.d.vocab, (batch, ctx + 1), device=device)
    start = time.perf_counter()
    F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return time.perf_counter() - start, torch.cuda.max_memory_allocated()
    return time.perf_counter() - start, 0
step(8)
t8, m8 = step(8)
total = torch.cuda.get_device_properties(0).total_memory if device.startswith("cuda") else 0
batch = max(8, min(192, int(0.7 * total / max(m8, 1) * 8) // 8 * 8)) if total else 8
tb, mb = step(batch)
print(f"probe: 8 windows {t8:.2f} s {m8 / 2**30:.1f} GB; {batch} windows {tb:.2f} s {mb / 2**30:.1f} GB", file=sys.stderr)
print(batch, max(5, int(seconds / (tb * 1.1))))
EOF
)
    [ -n "${STEPS:-}" ] || { echo "$w: probe failed"; exit 1; }
    echo "$w: batch $BATCH, steps $STEPS (${SECONDS}s)"
    (cd "$TOOLS" && "$PY" train_tiny.py --data "$WORK/data" --out "$WORK/$w/run" --device "$DEVICE" --steps "$STEPS" \
        --batch "$BATCH" --ctx "$CTX" --lr 1e-3 --warmup $((STEPS / 10 + 1)) --eval-every 0 --log-every 5 \
        --time-limit $((TRAIN_S + 30)) $DIMS) > "$WORK/$w/train_stdout.txt" 2>&1
    tail -n 3 "$WORK/$w/train_stdout.txt"
    [ -f "$WORK/$w/run/rwkv7-pydoc.pth" ] || { echo "$w: training failed"; collect; exit 1; }
    for r in $RECIPES; do
        setsid nohup bash "$0" recipe "$w" "$r" "$BUDGET" "$SEGMENTS" > "$WORK/$w/res/$r.log" 2>&1 < /dev/null &
    done
    echo "$w: recipes started at ${SECONDS}s"
done
wait_recipes
collect
echo "train phase ${SECONDS}s"
