#!/bin/bash
# Device run: from the carried snapshot, verify the pinned tree, patch, build the CPU and CUDA (sm_90)
# lanes, certify tiny-llama (and tiny-v4 if time allows) on the CUDA lane.  Everything lands in $OUT.
# Usage (device): bash .devrun/bundle/run.sh   env: LIMIT (s, default 520), STOP_AFTER=setup (rehearsal)
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/dgr-out}
W=${W:-/tmp/dgr}
LIMIT=${LIMIT:-520}
T0=$(date +%s)
mkdir -p "$OUT" "$W"
export DGR_WORK=$W/work
export PYTHONUNBUFFERED=1

step() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] == $*"; }
left() { echo $(( T0 + LIMIT - $(date +%s) )); }

probe() {
  step "probe"
  uname -a; cat /etc/os-release 2>/dev/null | head -4; ldd --version 2>&1 | head -1
  echo "nproc=$(nproc)"; free -g | head -2; df -h /tmp | tail -1
  nvidia-smi 2>&1 | head -20; nvidia-smi -L 2>&1
  for t in nvcc cmake ninja git g++ gcc c++ pkg-config ccache xz zstd tar ip tc dpkg python3; do
    printf '%-10s %s\n' "$t" "$(command -v $t || echo MISSING)"; done
  nvcc --version 2>&1 | tail -2; cmake --version 2>&1 | head -1; ninja --version 2>&1
  git --version 2>&1; g++ --version 2>&1 | head -1; python3 --version
  python3 -c 'import grpc, google.protobuf, numpy; print("device python: grpcio", grpc.__version__, "protobuf", google.protobuf.__version__, "numpy", numpy.__version__)' 2>&1
  ls -la /usr/local/cuda 2>&1 | head -2; ls /usr/local/cuda/include/cublas_v2.h /usr/local/cuda/lib64/libcublas.so* 2>&1 | head
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  ldconfig -p 2>/dev/null | grep -E 'libssl.so.3|libz.so.1 |libpcre2-8.so.0|libcuda.so' | head
  step "netem probe"
  if command -v ip >/dev/null && command -v tc >/dev/null; then
    ( timeout 20 ip netns add dgrprobe && timeout 20 ip netns exec dgrprobe ip link set lo up && \
      timeout 20 ip netns exec dgrprobe tc qdisc add dev lo root netem delay 1ms; echo "netem rc=$?"; \
      timeout 20 ip netns exec dgrprobe tc qdisc show dev lo; timeout 20 ip netns del dgrprobe ) 2>&1
  else
    echo "netem: ip or tc missing (ip=$(command -v ip) tc=$(command -v tc))"
  fi
}

setup() {
  step "setup: repo snapshot $(cat "$D/COMMIT")"
  rm -rf "$W/repo" && cp -a "$D/repo" "$W/repo"
  step "setup: wheels"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" ${RH_PIP_ARGS:-} "$D"/whl/*.whl || return 1
  if [ -n "${RH_PIP_ARGS:-}" ]; then export PYTHONPATH=$W/repo; else export PYTHONPATH=$W/site:$W/repo; fi
  python3 -c 'import grpc, google.protobuf, cryptography, jsonschema, blake3, grpc_tools; print("dgr python: grpcio", grpc.__version__, "protobuf", google.protobuf.__version__, "cryptography", cryptography.__version__)' || return 1
  step "setup: gRPC/protobuf sysroot (Debian 12)"
  S=$W/sysroot; rm -rf "$S"; mkdir -p "$S"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$D/sysroot.tar.xz" "$S" || return 1
  export PATH=$S/usr/bin:$PATH
  export LD_LIBRARY_PATH=$S/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if ! ldconfig -p 2>/dev/null | grep -q 'libssl.so.3 ' || ! ldconfig -p 2>/dev/null | grep -q 'libz.so.1 '; then
    echo "device lacks libssl.so.3 or libz.so.1: using the carried ones"; export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$S/opt-rt
  fi
  if ! command -v git >/dev/null; then
    echo "device has no git: using the carried Debian 12 git binary"; export PATH=$PATH:$S/fallback/bin
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$S/fallback/lib
  fi
  export PKG_CONFIG_SYSROOT_DIR=$S
  export PKG_CONFIG_LIBDIR=$S/usr/lib/x86_64-linux-gnu/pkgconfig:$S/usr/share/pkgconfig
  unset PKG_CONFIG_PATH
  echo "pkg-config $(pkg-config --version): $(pkg-config --modversion grpc++ protobuf | tr '\n' ' ')"
  pkg-config --cflags --libs grpc++ protobuf | tr ' ' '\n' | grep -E '^-[IL]' | sort -u
  protoc --version && ls -la "$(command -v grpc_cpp_plugin)" && git --version || return 1
  step "setup: pinned llama.cpp tree"
  mkdir -p "$DGR_WORK/src"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$D/llama.tar.xz" "$DGR_WORK/src" || return 1
  cp "$D/llama.cpp-4df29be4f4c3.provenance.json" "$DGR_WORK/src/"
  cd "$W/repo" || return 1
  step "dgr fetch --reverify (git tree id of the carried tree)"
  python3 -m certify fetch --reverify || return 1
  step "dgr patch"
  python3 -m certify patch || return 1
  step "cuBLAS"
  local nv root
  nv=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  root=$(dirname "$(dirname "$(readlink -f "$nv")")")
  if [ -f "$root/include/cublas_v2.h" ] && ls "$root"/lib64/libcublasLt.so* >/dev/null 2>&1; then
    echo "cuBLAS from the toolkit at $root"
  else
    local cb
    cb=$(python3 - <<'EOF'
import glob, os, sys
for p in sys.path:
    for c in sorted(glob.glob(os.path.join(p, "nvidia", "cu1*"))):
        if os.path.isfile(os.path.join(c, "include", "cublas_v2.h")) and glob.glob(os.path.join(c, "lib", "libcublasLt.so*")):
            print(c); sys.exit()
EOF
)
    if [ -n "$cb" ]; then export DGR_CUBLAS_ROOT=$cb; echo "DGR_CUBLAS_ROOT=$cb"; ls "$cb/lib"; else echo "no cuBLAS found"; fi
  fi
  export DGR_CUDA_ARCHITECTURES=90
  python3 -m certify doctor || true
}

build() {
  cd "$W/repo" || return 1
  step "build: cpu and cuda lanes concurrently, -j $(nproc) each"
  local b0=$(date +%s)
  ( s=$(date +%s); timeout -s TERM -k 15 $(( $(left) - 60 )) python3 -m certify build --lane cuda -j "$(nproc)" 2>&1 | sed -u 's/^/[cuda] /'; r=$?
    echo "[cuda] build exit $r wall $(( $(date +%s) - s )) s"; exit $r ) &
  local pc=$!
  ( s=$(date +%s); timeout -s TERM -k 15 $(( $(left) - 60 )) python3 -m certify build --lane cpu -j "$(nproc)" 2>&1 | sed -u 's/^/[cpu] /'; r=$?
    echo "[cpu] build exit $r wall $(( $(date +%s) - s )) s"; exit $r ) &
  local pp=$!
  wait $pc; RC_CUDA=$?; wait $pp; RC_CPU=$?
  step "builds done: cuda rc=$RC_CUDA cpu rc=$RC_CPU, both lanes together $(( $(date +%s) - b0 )) s wall"
  ls -la "$DGR_WORK"/builds/*/bin/dgr-shard-worker 2>&1
  for b in "$DGR_WORK"/builds/*/; do
    [ -f "$b/build.json" ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["lane"], d["key"][:16], "seconds", d["seconds"], "jobs", d["jobs"], d["toolchain"].get("versions"))' "$b/build.json"
  done
  [ "$RC_CUDA" = 0 ] && [ "$RC_CPU" = 0 ]
}

certify() {
  local recipe=$1 rem
  cd "$W/repo" || return 1
  rem=$(( $(left) - 25 ))
  step "dgr certify --recipe $recipe --lane cuda (timeout ${rem}s)"
  timeout -s TERM -k 15 "$rem" python3 -m certify certify --recipe "$recipe" --lane cuda
  local rc=$?
  step "certify $recipe exit $rc"
  local c
  c=$(ls -t "$DGR_WORK"/reports/"$recipe"/cuda/*/certificate.json 2>/dev/null | head -1)
  if [ -n "$c" ]; then
    cp "$c" "$OUT/$recipe-certificate.json"; cp "$(dirname "$c")/report.html" "$OUT/$recipe-report.html"
    python3 -m certify verify "$c" || true
  fi
  return $rc
}

main() {
  probe
  setup || { step "setup FAILED"; return 1; }
  [ "${STOP_AFTER:-}" = setup ] && { step "stop after setup"; return 0; }
  build || { step "build FAILED"; return 1; }
  certify tiny-llama; RC_TL=$?
  if [ "$(left)" -gt 150 ]; then
    certify tiny-v4 || true
  else
    step "skip tiny-v4: $(left) s left"
  fi
  return $RC_TL
}

collect() {
  step "collect"
  cp "$DGR_WORK"/keys/*.pub.pem "$OUT/" 2>/dev/null
  ( cd "$DGR_WORK" 2>/dev/null && tar -cJf "$OUT/results.tar.xz" --ignore-failed-read \
      reports runs keys/dev-ed25519.pub.pem src/*.provenance.json patched/*.provenance.json \
      $(ls builds/*/build.json builds/*/CMakeCache.txt builds/*/CMakeFiles/CMakeConfigureLog.yaml 2>/dev/null) 2>&1 | tail -3 )
  ls -la "$OUT"
}

main 2>&1 | tee -a "$OUT/log.txt"
RC=${PIPESTATUS[0]}
collect 2>&1 | tee -a "$OUT/log.txt"
echo "run.sh exit $RC after $(( $(date +%s) - T0 )) s" | tee -a "$OUT/log.txt"
exit "$RC"
