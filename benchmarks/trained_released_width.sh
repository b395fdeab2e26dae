# Train a byte-level RWKV-7 at a released width on a GPU, then export + gate it under each recipe
# on the same machine's CPUs (benchmarks/trained_released_width.py, one process per recipe).
#
#   bash benchmarks/trained_released_width.sh train     # probe, train, start the recipes (detached)
#   bash benchmarks/trained_released_width.sh collect   # wait for the recipes, merge their JSON
#
# Both phases write what they have under $OUT (the call's figures) and end by $PHASE_S seconds,
# so each fits one call of a machine lent per call; the recipes run detached (setsid) between
# the two. Settings (environment): DIMS (tools/train_tiny.py's width flags; default RWKV-7
# 0.1B's shape), TRAIN_S (seconds of training, the step count sized to it by a timed probe),
# RECIPES, BUDGET (auto's --size-budget), HELD_OUT_S, RECIPE_S (each recipe's timeout), DATA
# (train.u16 + validation.u16, or their .xz), WORK (scratch), PY (python), DEVICE.
set -u
PHASE=${1:?train or collect}
HERE=$(cd "$(dirname "$0")" && pwd)
TOOLS=${TOOLS:-$HERE/../tools}
PY=${PY:-python3}
WORK=${WORK:-/tmp/trw}
OUT=${OUT:-$WORK/out}
DATA=${DATA:-$WORK/data}
DEVICE=${DEVICE:-cuda}
DIMS=${DIMS:---layers 12 --width 768 --ffn 3072 --decay-lora 64 --a-lora 64 --v-lora 32 --gate-lora 128}
TRAIN_S=${TRAIN_S:-240}
PHASE_S=${PHASE_S:-570}
RECIPES=${RECIPES:-fp16 int8keepproj int4keepproj auto}
BUDGET=${BUDGET:-90MB}
HELD_OUT_S=${HELD_OUT_S:-420}
RECIPE_S=${RECIPE_S:-800}
export PYTHONUNBUFFERED=1
mkdir -p "$WORK/data" "$WORK/res" "$OUT"

collect() {  # the recipes' JSON merged, their logs in one file
    "$PY" "$HERE/trained_released_width.py" merge $(ls "$WORK"/res/*.json 2>/dev/null) --train-log "$WORK/run/train_log.jsonl" \
        --json "$OUT/results.json"
    tail -n +1 "$WORK"/res/*.log > "$OUT/recipes_log.txt"
}

wait_recipes() {  # until every recipe process ended or PHASE_S
    while pgrep -f "trained_released_width.py run" > /dev/null && [ "$SECONDS" -lt "$PHASE_S" ]; do sleep 5; done
    pgrep -fa "trained_released_width.py run" | sed 's/^/still running: /'
}

if [ "$PHASE" = collect ]; then
    wait_recipes
    collect
    exit 0
fi

for f in train.u16 validation.u16; do
    [ -f "$DATA/$f" ] && cp "$DATA/$f" "$WORK/data/$f" || xz -dc "$DATA/$f.xz" > "$WORK/data/$f" || exit 1
done
# Probe: the memory and time of one training step at 8 windows, then at the batch that fills
# about 70% of the GPU; the step count is what TRAIN_S allows at that batch.
read -r BATCH STEPS < <(cd "$TOOLS" && "$PY" - "$DEVICE" "$TRAIN_S" $DIMS <<'EOF'
import argparse, sys, time
import torch
import torch.nn.functional as F
from rwkv7_trainable import RWKV7, Dims
device, seconds = sys.argv[1], float(sys.argv[2])
p = argparse.ArgumentParser()
for f in Dims().to_json():
    p.add_argument(f"--{f.replace('_', '-')}", type=int, default=getattr(Dims(), f))
model = RWKV7(Dims(**vars(p.parse_args(sys.argv[3:])))).to(device)
def step(batch):
    if device.startswith("cuda"):
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    x = torch.randint(0, model.d.vocab, (batch, 513), device=device)
    start = time.perf_counter()
    F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return time.perf_counter() - start, torch.cuda.max_memory_allocated()
    return time.perf_counter() - start, 0
step(8)
t8, m8 = step(8)
total = torch.cuda.get_device_properties(0).total_memory if device.startswith("cuda") else 0
batch = max(8, min(96, int(0.7 * total / max(m8, 1) * 8) // 8 * 8)) if total else 8
tb, mb = step(batch)
print(f"probe: 8 windows {t8:.2f} s {m8 / 2**30:.1f} GB; {batch} windows {tb:.2f} s {mb / 2**30:.1f} GB", file=sys.stderr)
print(batch, max(20, int(seconds / (tb * 1.1))))
EOF
)
[ -n "${STEPS:-}" ] || { echo "probe failed"; exit 1; }
echo "batch $BATCH, steps $STEPS"
mkdir -p "$WORK/run"
(cd "$TOOLS" && "$PY" train_tiny.py --data "$WORK/data" --out "$WORK/run" --device "$DEVICE" --steps "$STEPS" \
    --batch "$BATCH" --ctx 512 --lr 1e-3 --warmup $((STEPS / 10 + 1)) --eval-every 100 --log-every 5 \
    --time-limit $((TRAIN_S + 30)) $DIMS) 2>&1 | tee "$OUT/train_stdout.txt"
cp "$WORK/run/train_log.jsonl" "$OUT/" || exit 1
W="$WORK/run/rwkv7-pydoc.pth"
for r in $RECIPES; do
    for mode in decode prefill; do
        extra=(--held-out-seconds "$HELD_OUT_S")
        [ "$mode" = prefill ] && extra=(--prefill --held-out-steps 0 --label "$r+prefill")
        setsid nohup timeout "$RECIPE_S" "$PY" "$HERE/trained_released_width.py" run --weights "$W" --recipe "$r" \
            --budget "$BUDGET" --json "$WORK/res/$r-$mode.json" "${extra[@]}" > "$WORK/res/$r-$mode.log" 2>&1 < /dev/null &
    done
done
echo "recipes started at ${SECONDS}s"
wait_recipes
collect
echo "train phase ${SECONDS}s"
