#!/bin/bash
# The GPU checks, as one script for a lent GPU machine (which has CUDA but
# no Rust toolchain): the cuBLAS tests, the GEMM benchmark and the MLP step
# on cpu/gpu/auto. Results of each run: docs/benchmarks.md ("The GPU path").
#
# Here (the build machine), pack the binaries of this tree into .gpu/ (which
# .git/info/exclude ignores), one xz archive with a large dictionary so the
# three binaries' shared code is stored once (the library's unit tests are
# in the suite, tests/unit/):
#
#   ARGS="--workspace --features datafusion-grad/cuda,datafusion-grad/ballista,datafusion-grad-python/test-build"
#   cargo test $ARGS -p datafusion-grad --no-run --test suite --bench gpu_gemm   # prints the paths
#   cargo build $ARGS --bin dfgrad
#   strip -o /tmp/suite <suite binary>
#   strip -o /tmp/gpu_gemm <gpu_gemm binary>; strip -o /tmp/dfgrad <target>/debug/dfgrad
#   mkdir -p .gpu && (cd /tmp && tar cf - suite dfgrad gpu_gemm) \
#       | xz -6 --lzma2=preset=6,dict=1GiB -T1 > .gpu/gpubins.tar.xz
#
# then run `bash benches/gpu_device_check.sh` there with `.gpu` carried; what
# it writes under $OUT comes back.
cd "$(dirname "$0")/.."
t0=$(date +%s)
stamp() { echo "=== $1 at $(( $(date +%s) - t0 )) s"; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
mkdir -p /tmp/b && xz -dc .gpu/gpubins.tar.xz | tar xf - -C /tmp/b
stamp unpacked
# cuBLAS by its unversioned name, from the toolkit (never its lib/stubs).
L=$(dirname "$(ls /usr/local/cuda*/targets/x86_64-linux/lib/libcublas.so 2>/dev/null | head -1)")
echo "cublas dir: $L"
export LD_LIBRARY_PATH=$L:$LD_LIBRARY_PATH
export DFGRAD_REQUIRE_GPU=1
/tmp/b/suite unit::tensor_ 2>&1 | tail -30 | tee "$OUT/unit_tensor.txt"
/tmp/b/suite cuda:: --skip unit:: 2>&1 | tail -12 | tee "$OUT/suite_cuda.txt"
unset DFGRAD_REQUIRE_GPU
stamp tests
timeout 200 /tmp/b/gpu_gemm --bench --warm-up-time 0.2 --measurement-time 0.6 2>&1 \
    | grep -E "^gpu_gemm|time:" | tee "$OUT/gemm.txt"
stamp gemm
for d in cpu gpu auto; do
    PYTHONUNBUFFERED=1 timeout 100 python3 benches/compare_mlp.py --dfgrad /tmp/b/dfgrad \
        --steps 30 --repeat 3 --device $d 2>&1 | tail -12 | tee -a "$OUT/mlp.txt"
    stamp "mlp-$d"
done
