#!/usr/bin/env bash
# A lent GPU's checks in one command of at most about 8 minutes, set-up included:
#
#   bash .gpu/setup && . .gpu/env && bash tools/gpu-check.sh
#
# 1. the device benchmark, `tmpi bench --parts device --quick`, from a cold Theano cache
#    (its JSON: $OUT/bench-device-quick.json; stopped after BENCH_TIMEOUT seconds, it
#    still writes what it measured);
# 2. steps whose rows meet (tests/scripts/batch_coupling.py, a few cases, float64), 1 and 2
#    ranks on the device, compared (each run stopped after COUPLING_TIMEOUT, 150 s);
# 3. the suite's device tests, tests/test_gpu.py, at TMPI_TEST_DEVICE=$DEVICE, in the time
#    left of BUDGET (each test's outcome is in the log as it ends, so a run cut short still
#    says which passed).
# Every log lands in $OUT (default: gpu-check/), with summary.txt, which is also printed.
#
#   DEVICE        cuda0 (default), or opencl0:0: the OpenCL device `make gpu` sets up on
#                 the CPU (its flags file keeps the ops pocl cannot run on the host)
#   BUDGET        420 s for this script (set-up before it takes 35-50 s on a GPU machine)
#   BENCH_TIMEOUT 180 s;  TESTS_TIMEOUT what BUDGET leaves (at least 60 s);  WORKERS 4
#   TESTS         a pytest -k expression: some of the device tests only
#   BENCH_ARGS    more options for tmpi bench (--device-batch-size 256, --steps 20, ...)
#
# The device tests train on scikit-learn's digits: a .gpu/ packed without it can take its
# wheels (11 MB; .gpu/setup unpacks every wheel in .gpu/wheels into the venv):
#   .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -c constraints.txt \
#       -d .gpu/wheels scikit-learn joblib threadpoolctl
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check}
mkdir -p "$out"
device=${DEVICE:-cuda0}
budget=${BUDGET:-420}
bench_timeout=${BENCH_TIMEOUT:-180}
workers=${WORKERS:-4}
venv=${VENV:-.venv}
py=$venv/bin/python
summary=$out/summary.txt
: > "$summary"
say() { echo "gpu-check: $*" | tee -a "$summary"; }
# Runs "$@" under a deadline (TERM, then KILL 20 s later), its output in log $1; never waits
# on anything it did not start itself.
bounded() {
    local log=$1 limit=$2; shift 2
    local begin=$SECONDS
    timeout -k 20 -s TERM "$limit" "$@" > "$log" 2>&1 < /dev/null
    local status=$?
    echo "$status $((SECONDS - begin))"
}

case $device in
    opencl*)
        flags=$(cat "$venv/opencl-theano-flags" 2>/dev/null) || {
            say "no $venv/opencl-theano-flags: run make gpu first"; exit 1; }
        bench_flags="$(echo "$flags" | sed "s/device=[^,]*/device=$device/"),floatX=float32"
        test_flags="" ;;
    *)
        # Theano 1.0.5's cuDNN ops predate cuDNN 9: convolutions run as GpuCorrMM.
        bench_flags="device=$device,floatX=float32,dnn.enabled=False"
        test_flags="dnn.enabled=False" ;;
esac

say "$(date -u +%FT%TZ) on $(hostname): DEVICE=$device, $(nproc) cores, $($py --version 2>&1)"
if command -v nvidia-smi > /dev/null; then
    timeout 30 nvidia-smi > "$out/nvidia-smi.txt" 2>&1
    say "$(timeout 30 nvidia-smi -L 2>&1 | head -1)"
fi
read -r status seconds < <(bounded "$out/device.log" 120 "$py" -c "
import pygpu
context = pygpu.init('$device')
print('pygpu %s (%s) opens $device: %s' % (pygpu.__version__, pygpu.__file__,
                                           context.devname.strip()))")
say "$(tail -1 "$out/device.log") (exit $status, ${seconds} s)"

# 1. The device benchmark, first: its Theano cache is still cold.
read -r status seconds < <(THEANO_FLAGS=$bench_flags bounded "$out/bench.log" "$bench_timeout" \
    "$venv/bin/tmpi" bench --parts device --quick --no-progress ${BENCH_ARGS:-} \
    --json "$out/bench-device-quick.json")
say "tmpi bench --parts device --quick: exit $status in ${seconds} s (limit ${bench_timeout} s)"
grep -E '^(device:|tmpi bench:|tmpi: error)' "$out/bench.log" | sed 's/^/  /' | tee -a "$summary"
if [ -f "$out/bench-device-quick.json" ]; then
    "$py" - "$out/bench-device-quick.json" <<'PY' | tee -a "$summary"
import json, sys
data = json.load(open(sys.argv[1]))
device = data.get("device", {})
print("  device %s, batch %s, compiled in %s s, %d runs%s" % (
    device.get("device"), device.get("batch_size"), device.get("compile_s"),
    len(device.get("runs", [])), ", cut short: " + data["stopped"] if "stopped" in data else ""))
for key in ("overhead_1_rank", "two_ranks_over_independent", "two_ranks_over_one_process",
            "exchange_s_per_step"):
    if key in device:
        print("  %s %.4g" % (key, device[key]))
for key, bar in data.get("bars", {}).items():
    print("  bar %s: %s %s: %s" % (key, bar["value"], bar["bar"], "met" if bar["met"] else "not met"))
PY
fi

# 2. Steps whose rows meet (batch statistics, halves, a Gram matrix, a rate the updates
#    read), float64 on the device: 2 ranks must give the one-process numbers.
coupling_timeout=${COUPLING_TIMEOUT:-150}
cases=${COUPLING_CASES:-batch_norm halves gram adaptive_rate}
coupling_flags="$(echo "$bench_flags" | sed 's/floatX=float32/floatX=float64/')"
for ranks in 1 2; do
    read -r status seconds < <(THEANO_FLAGS=$coupling_flags bounded "$out/coupling-$ranks.log" \
        "$coupling_timeout" "$venv/bin/tmpi" wrap -n "$ranks" --framework theano \
        tests/scripts/batch_coupling.py 10 $cases)
    say "coupled steps on $ranks rank(s): exit $status in ${seconds} s"
done
"$py" - "$out/coupling-1.log" "$out/coupling-2.log" <<'PY' | tee -a "$summary"
import sys
def cases(path):
    found = {}
    for line in open(path, errors="replace"):
        head, _, rest = line.partition(" ")
        if head in ("final", "error"):
            case, _, value = rest.strip().partition(" ")
            found[case] = (head, value)
    return found
one, two = cases(sys.argv[1]), cases(sys.argv[2])
for case in sorted(set(one) | set(two)):
    a, b = one.get(case), two.get(case)
    if not a or not b or a[0] != "final" or b[0] != "final":
        print("  %s: 1 rank %s, 2 ranks %s" % (case, a and a[0], b and b[0]))
        continue
    x, y = [float(v) for v in a[1].split()], [float(v) for v in b[1].split()]
    worst = max(abs(p - q) / max(abs(p), abs(q), 1e-300) for p, q in zip(x, y))
    print("  %s: 2 ranks vs 1, largest relative difference %.2g" % (case, worst))
PY
grep -h "where the batch's rows meet" "$out/coupling-2.log" | sed 's/^.*per step (/  (/' | head -4 | tee -a "$summary"

# 3. The device tests (the CPU-only ones in the file run too: a few seconds).
"$py" -c "import sklearn" 2> /dev/null ||
    say "no scikit-learn in $venv: the tests that train on its digits fail at once (ModuleNotFoundError)"
tests_timeout=${TESTS_TIMEOUT:-$((budget - SECONDS > 60 ? budget - SECONDS : 60))}
read -r status seconds < <(TMPI_TEST_DEVICE=$device THEANO_FLAGS=$test_flags \
    bounded "$out/tests.log" "$tests_timeout" "$py" -m pytest -v -rs -p no:cacheprovider \
    -n "$workers" --dist load --durations=15 --junitxml="$out/tests.xml" ${TESTS:+-k "$TESTS"} \
    tests/test_gpu.py)
say "tests/test_gpu.py at TMPI_TEST_DEVICE=$device: exit $status in ${seconds} s (limit ${tests_timeout} s)"
# Outcomes as the tests ended (whatever the end), then pytest's own closing lines.
{ grep -oE '\] (PASSED|FAILED|ERROR|SKIPPED) ' "$out/tests.log" | cut -c3- | sort | uniq -c
  grep -E '^(FAILED|ERROR|SKIPPED) |^=+ .*(passed|failed|error).* =+$' "$out/tests.log"; } \
    | sed 's/^ */  /' | tee -a "$summary"
say "logs in $out: summary.txt device.log bench.log bench-device-quick.json coupling-1.log coupling-2.log tests.log tests.xml"
