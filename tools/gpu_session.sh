#!/usr/bin/env bash
# One session on a lent GPU machine (the `device` tool): what the machine is, the test
# suite with Triton compiled for real (TRITON_INTERPRET=0: NumPy inputs of the Triton
# backend go to the GPU), then `einfuse bench --device cuda`, one case per process so a
# case that hangs or crashes costs only itself.  Everything lands under $OUT.
#
#   tools/gpu_session.sh [kernels] [overhead] [tests] [bench] [CASE-PREFIX ...]
#
# kernels: tools/gpu_kernels.py (per-configuration timings).  PYTEST_K selects tests by
# pytest's -k expression (a short lease: "triton or cuda or gpu or jax").  Results are packed into
# $OUT/results.tgz, or $OUT/$RESULTS.tgz (the device tool brings back only a few files).
#
# Wheels under .gpu/wheels (an ignored folder, carried along) are installed first: the
# machine has no registry (pykeops, keopscore and jax_triton are not in its image).
set -u
FINAL=${OUT:-/tmp/einfuse-gpu}
OUT="$FINAL/results"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src" TRITON_INTERPRET=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1
PY=python3
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

if [ -d .gpu/wheels ] && ls .gpu/wheels/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-deps --no-index .gpu/wheels/*.whl > "$OUT/pip.txt" 2>&1
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    $PY - <<'PY'
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "triton", "jax", "jaxlib", "jax_triton", "pykeops", "numpy", "hypothesis"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as error:
        print(name, "unavailable:", type(error).__name__, error)
import torch
p = torch.cuda.get_device_properties(0)
print("SMs", p.multi_processor_count, "L2", getattr(p, "L2_cache_size", "?"))
PY
    gcc --version | head -1
} > "$OUT/env.txt" 2>&1

want_tests=0; want_bench=0; want_kernels=0; want_overhead=0; cases=()
for arg in "$@"; do
    case "$arg" in
        kernels) want_kernels=1 ;;
        overhead) want_overhead=1 ;;
        tests) want_tests=1 ;;
        bench) want_bench=1 ;;
        *) cases+=("$arg") ;;
    esac
done

if [ "$want_kernels" = 1 ]; then
    timeout "${KERNELS_LIMIT:-200}" $PY tools/gpu_kernels.py ${KERNELS:-} > "$OUT/kernels.txt" 2>&1
    echo "exit $? after $(elapsed) s" >> "$OUT/kernels.txt"
fi

if [ "$want_overhead" = 1 ]; then   # tools/gpu_overhead.py: kernel, call and host times
    timeout "${OVERHEAD_LIMIT:-120}" $PY tools/gpu_overhead.py > "$OUT/overhead.txt" 2>&1
    echo "exit $? after $(elapsed) s" >> "$OUT/overhead.txt"
fi

if [ "$want_tests" = 1 ]; then
    timeout "${TEST_LIMIT:-240}" $PY -m pytest ${PYTEST_VERBOSITY:--q} -n "${WORKERS:-14}" -p no:cacheprovider \
        -rfE --tb=short --timeout=120 ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} \
        > "$OUT/pytest.txt" 2>&1
    echo "pytest exit $? after $(elapsed) s" >> "$OUT/pytest.txt"
fi

if [ "$want_bench" = 1 ]; then
    if [ ${#cases[@]} = 0 ]; then
        mapfile -t cases < <($PY -c "from einfuse.bench.catalogue import gpu_cases
names = [c.name for c in gpu_cases('cuda') if not c.name.startswith('dist fwd')]
print('\\n'.join(names + ['dist fwd']))")
    fi
    n=0
    for case in "${cases[@]}"; do
        n=$((n + 1))
        if [ "$(elapsed)" -gt "${BENCH_STOP:-540}" ]; then
            echo "skipped: $case (time)" >> "$OUT/bench-skipped.txt"; continue
        fi
        timeout "${CASE_LIMIT:-150}" $PY -m einfuse.cli bench --device cuda --budget "${BUDGET:-1}" \
            --case "$case" --out "$OUT/bench-$n" > "$OUT/bench-$n.txt" 2>&1
        echo "exit $? after $(elapsed) s" >> "$OUT/bench-$n.txt"
    done
fi
if [ "$want_bench" = 1 ]; then   # one table, printed and brought back beside the archive
    $PY tools/gpu_join.py "$OUT" > "$FINAL/${RESULTS:-results}-table.md" 2>&1
    cat "$FINAL/${RESULTS:-results}-table.md"
    cat "$OUT/bench-skipped.txt" 2>/dev/null
fi
echo "done after $(elapsed) s" > "$OUT/done.txt"
tar czf "$FINAL/${RESULTS:-results}.tgz" -C "$FINAL" results && rm -rf "$OUT"
