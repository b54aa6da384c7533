#!/usr/bin/env bash
# A GPU session in one command (docs/device.md).  From an unpacked device bundle, on a box with no
# network: check the bundle, set up Python and (when the OS has no libgrpc++-dev) the carried gRPC
# sysroot, verify and patch the carried llama.cpp tree, build the CUDA lane for this GPU's compute
# capability and the CPU reference at the same time (worker and libllama only), provision, then
# `dgr certify` and `dgr verify` each recipe on cuda, and with the time left, the ring floor
# (dgr-ring-floor on tiny-llama at 1, 2, 4 and 12 stages, every layer on the GPU: the stages' floor
# with nothing of ours in the way).  Everything lands in one output folder.
#
#   bash BUNDLE/project/scripts/device-cuda.sh [--out DIR] [--work DIR] [--bundle DIR] [--lane cuda|cpu]
#        [--recipe NAME]... [--jobs N] [--limit SECONDS] [--dry-run]
#
#   --out     output folder (default $OUT, else ./device-out): log.txt, timings.tsv, summary.json,
#             results.tar.gz (certificates, reports, verify output, build.json, run records, dev key,
#             ring-floor.jsonl)
#   --work    scratch and workspace (default /tmp/dgr-device; DGR_WORK is <work>/work)
#   --lane    cuda (default) or cpu: the same steps for the CPU lane alone (no GPU needed)
#   --recipe  recipe to certify (repeatable; default: the bundle's, tiny-llama tiny-v4 gemma3-270m-q4)
#   --limit   wall-clock budget in seconds (default 570); a recipe that cannot start in time is skipped
#   --dry-run the set-up steps only (bundle, Python, sysroot, fetch --reverify, patch, provision);
#             build, certify and verify are printed, not run
# Environment: DGR_DEVICE_VENV / DGR_DEVICE_SYSROOT = auto (default) | always | never;
#   DGR_CUDA_ARCHITECTURES (default: the GPU's own, from nvidia-smi); PYTHON (default python3).
# Exit: 0 every certificate PASS and verified; 5 a gate failed (its signed FAIL is collected, the other
#   recipes still run); 6 a step failed; 3 the bundle does not match its manifest; 2 usage.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUNDLE=$(cd "$HERE/../.." && pwd)
OUT_DIR=${OUT:-$PWD/device-out}
WORK=/tmp/dgr-device
LANE=cuda
RECIPES=()
JOBS=$(nproc)
LIMIT=570
DRY_RUN=0

usage() { sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT_DIR=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --bundle) BUNDLE=$2; shift 2 ;;
    --lane) LANE=$2; shift 2 ;;
    --recipe) RECIPES+=("$2"); shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "device-cuda.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done
case $LANE in cuda|cpu) ;; *) echo "device-cuda.sh: --lane must be cuda or cpu" >&2; exit 2 ;; esac
[ -f "$BUNDLE/BUNDLE.json" ] || { echo "device-cuda.sh: $BUNDLE has no BUNDLE.json (give --bundle DIR)" >&2; exit 2; }

BUNDLE=$(cd "$BUNDLE" && pwd)
mkdir -p "$OUT_DIR" "$WORK"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(cd "$WORK" && pwd)
PROJ=$BUNDLE/project
PY0=${PYTHON:-python3}
PY=$PY0
COLLECT=$WORK/collect/results
TIMINGS=$OUT_DIR/timings.tsv
RESULTS=$WORK/recipes.tsv
# no __pycache__ inside the bundle: every file there is in its manifest, and a second run checks it again
export DGR_WORK=$WORK/work DGR_STORE=$WORK/store PYTHONPATH=$PROJ PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

export LC_NUMERIC=C  # EPOCHREALTIME's decimal point
[ -n "${EPOCHREALTIME:-}" ] || { echo "device-cuda.sh: needs bash >= 5" >&2; exit 2; }
us() { echo "${EPOCHREALTIME/./}"; }
T0=$(us)
secs() { local d=$(( ($(us) - $1) / 100000 )); echo "$(( d / 10 )).$(( d % 10 ))"; }
left() { echo $(( LIMIT - ($(us) - T0) / 1000000 )); }
say() { echo "[$(date -u +%H:%M:%S) +$(secs "$T0")s] $*"; }
# timed NAME COMMAND...: run it, print and record its wall time and exit code; returns the exit code
timed() {
  local name=$1 s rc=0; shift
  s=$(us); say "== $name"
  "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$(secs "$s")" "$rc" >>"$TIMINGS"
  say "== $name: exit $rc after $(secs "$s") s"
  return "$rc"
}
dgr() { (cd "$PROJ" && "$PY" -m certify "$@"); }
device() { (cd "$PROJ" && "$PY" -m device "$@"); }
bundle_field() { "$PY0" -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d=d[k] if d is not None else None
print(" ".join(d) if isinstance(d, list) else ("" if d is None else d))' "$BUNDLE/BUNDLE.json" "$1"; }

probe() {
  uname -srm; grep -E '^(PRETTY_NAME)=' /etc/os-release 2>/dev/null || true
  echo "cores $(nproc), jobs $JOBS, limit ${LIMIT}s, lane $LANE, bundle $BUNDLE, work $WORK, out $OUT_DIR"
  free -g 2>/dev/null | head -2 || true
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; else echo "nvidia-smi: not found"; fi
  local t
  for t in "$PY0" cmake ninja g++ gcc git pkg-config nvcc ccache ldconfig tar; do
    printf '%-12s %s\n' "$t" "$(command -v "$t" || echo MISSING)"
  done
  "$PY0" --version; cmake --version 2>/dev/null | head -1 || true; g++ --version 2>/dev/null | head -1 || true
  nvcc --version 2>/dev/null | tail -2 || true
}

python_env() {
  local mode=${DGR_DEVICE_VENV:-auto} tagdir pipwhl purelib
  if [ "$mode" != always ] && device python-check; then say "using $PY0 as it is"; return 0; fi
  [ "$mode" = never ] && { say "DGR_DEVICE_VENV=never but $PY0 lacks what the project needs"; return 6; }
  tagdir=$BUNDLE/wheels/cp$("$PY0" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
  [ -d "$tagdir" ] || { say "the bundle has no wheels for $("$PY0" --version) ($tagdir): make it with --python X.Y"; return 6; }
  pipwhl=$(ls "$tagdir"/pip-*.whl 2>/dev/null | head -1)
  [ -n "$pipwhl" ] || { say "the bundle's $tagdir has no pip wheel"; return 6; }
  rm -rf "$WORK/venv"
  "$PY0" -m venv --without-pip "$WORK/venv" || return 6
  if [ -n "$(bundle_field wheels.omitted)" ]; then
    # wheels left out of the bundle come from $PY0's own environment (a venv's too, which
    # --system-site-packages would miss), found after the venv's own packages
    purelib=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PY0" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])' \
      >"$purelib/_dgr_omitted_wheels.pth" || return 6
    say "omitted wheels ($(bundle_field wheels.omitted)) come from $PY0's environment"
  fi
  # pip runs from its own wheel: no ensurepip (Debian's python3 may lack python3-venv), no index
  # (and no pip configuration of the box's own: its index, constraints or find-links do not apply)
  env $(compgen -e | grep '^PIP_' | sed 's/^/-u /') PIP_CONFIG_FILE=/dev/null \
    "$WORK/venv/bin/python" "$pipwhl/pip" install --no-index --no-cache-dir --no-compile \
    --find-links "$tagdir" --quiet -r "$BUNDLE/wheels/requirements.txt" || return 6
  PY=$WORK/venv/bin/python
  say "venv $WORK/venv from $(ls "$tagdir"/*.whl | wc -l) bundled wheels"
  device python-check || return 6
}

sysroot_env() {
  local mode=${DGR_DEVICE_SYSROOT:-auto} S=$BUNDLE/sysroot L known lib name rt=$WORK/sysroot-rt
  if [ "$mode" != always ] && pkg-config --exists grpc++ protobuf 2>/dev/null \
      && command -v protoc >/dev/null && command -v grpc_cpp_plugin >/dev/null; then
    say "system gRPC: grpc++ $(pkg-config --modversion grpc++), protobuf $(pkg-config --modversion protobuf)"
    return 0
  fi
  [ "$mode" = never ] && { say "DGR_DEVICE_SYSROOT=never but the system has no grpc++/protoc/grpc_cpp_plugin"; return 6; }
  [ -d "$S/usr" ] || { say "the system has no grpc++ and the bundle carries no sysroot"; return 6; }
  L=$S/usr/lib/x86_64-linux-gnu
  export PKG_CONFIG_SYSROOT_DIR=$S PKG_CONFIG_LIBDIR=$L/pkgconfig:$S/usr/share/pkgconfig
  unset PKG_CONFIG_PATH
  export PATH=$S/usr/bin:$PATH
  # At run time only the sysroot's libraries whose soname the system lacks: a newer system libssl or
  # libz stays in use (objdump reads the soname; without it every library is offered)
  known=$(ldconfig -p 2>/dev/null || true)
  rm -rf "$rt"; mkdir -p "$rt"
  for lib in "$L"/lib*.so.*; do
    [ -L "$lib" ] && continue
    name=$(objdump -p "$lib" 2>/dev/null | awk '$1 == "SONAME" {print $2}')
    name=${name:-${lib##*/}}
    grep -qF -- $'\t'"$name (" <<<"$known" || ln -sfn "$lib" "$rt/$name"
  done
  export LD_LIBRARY_PATH=$rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  say "carried Debian 12 sysroot at $S; sonames the system lacks, from it: $(ls "$rt" | tr '\n' ' ')"
  echo "pkg-config $(pkg-config --version): grpc++ $(pkg-config --modversion grpc++) protobuf" \
    "$(pkg-config --modversion protobuf)" || return 6
  pkg-config --cflags --libs grpc++ protobuf | tr ' ' '\n' | grep -E '^-[IL]' | sort -u
  protoc --version || return 6
  local gen=$WORK/protoc-check; rm -rf "$gen"; mkdir -p "$gen"
  # the worker's own proto through the carried protoc and plugin: their runtime libraries load
  protoc --proto_path="$PROJ/worker/proto" --cpp_out="$gen" --grpc_out="$gen" \
    --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" "$PROJ/worker/proto/shard.proto" || return 6
  echo "protoc + grpc_cpp_plugin generated: $(ls "$gen" | tr '\n' ' ')"
}

tree() {
  mkdir -p "$DGR_WORK/src"
  local dir; dir=$(bundle_field llama.dir)
  if [ ! -d "$DGR_WORK/src/${dir##*/}" ]; then
    cp -a "$BUNDLE/$dir" "$DGR_WORK/src/" || return 6
    cp -a "$BUNDLE/$(bundle_field llama.provenance)" "$DGR_WORK/src/" || return 6
  fi
  dgr fetch --reverify
}

gpu_arch() {
  if [ -n "${DGR_CUDA_ARCHITECTURES:-}" ]; then say "DGR_CUDA_ARCHITECTURES=$DGR_CUDA_ARCHITECTURES (given)"; return 0; fi
  local caps
  caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader) || { say "nvidia-smi could not report compute_cap"; return 6; }
  DGR_CUDA_ARCHITECTURES=$(tr -d ' .' <<<"$caps" | sort -u | paste -sd ';')
  [ -n "$DGR_CUDA_ARCHITECTURES" ] || { say "no GPU reported by nvidia-smi"; return 6; }
  export DGR_CUDA_ARCHITECTURES
  say "GPU compute capability $(paste -sd ' ' <<<"$caps"): DGR_CUDA_ARCHITECTURES=$DGR_CUDA_ARCHITECTURES"
}

provision() {
  local d rc=0 r
  mkdir -p "$DGR_STORE"
  if [ -d "$BUNDLE/store" ]; then
    for d in "$BUNDLE"/store/*/*; do
      [ -d "$d" ] || continue
      mkdir -p "$DGR_STORE/$(basename "$(dirname "$d")")"
      cp -a "$d" "$DGR_STORE/$(basename "$(dirname "$d")")/" || return 6
    done
  fi
  for r in "${RECIPES[@]}"; do dgr provision --recipe "$r" || rc=$?; done
  return "$rc"
}

# prefixed NAME COMMAND...: run with every output line prefixed "[NAME] " (for jobs side by side)
prefixed() {
  local name=$1; shift
  "$@" 2>&1 | sed -u "s/^/[$name] /"
  return "${PIPESTATUS[0]}"
}
# to_file FILE COMMAND...: run it, its output to the log and to FILE
to_file() {
  local file=$1; shift
  "$@" 2>&1 | tee "$file"
  return "${PIPESTATUS[0]}"
}

builds() {
  local lanes=(cpu) pids=() l i rc=0 budget
  [ "$LANE" = cuda ] && lanes=(cuda cpu)
  budget=$(( $(left) - 30 ))
  for l in "${lanes[@]}"; do
    timed "build-$l" prefixed "$l" timeout -k 15 "$budget" "$PY" -m device build --lane "$l" -j "$JOBS" &
    pids+=($!)
  done
  # the tiny sets are generated while the compilers run; a set that fails here fails its own
  # certification (which provisions again and says why), not the others
  timed provision prefixed provision provision &
  local prov=$!
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  wait "$prov" || say "provisioning failed for a recipe (above); its certification will say so"
  return "$rc"
}

certify_one() {
  local r=$1 rc=0 cert="" vrc=0 budget run verdict
  budget=$(( $(left) - 15 ))
  if [ "$budget" -lt 45 ]; then
    say "SKIP $r: ${budget}s left"; printf '%s\tSKIPPED\t-\t-\t\n' "$r" >>"$RESULTS"; return 0
  fi
  mkdir -p "$COLLECT/$r"
  timed "certify-$r" to_file "$COLLECT/$r/certify.txt" \
    timeout -k 15 "$budget" "$PY" -m certify certify --recipe "$r" --lane "$LANE" || rc=$?
  cert=$(sed -n 's/^certificate: //p' "$COLLECT/$r/certify.txt" | tail -1)
  if [ -n "$cert" ] && [ -f "$cert" ]; then
    cp "$cert" "$COLLECT/$r/certificate.json"
    cp "$(dirname "$cert")/report.html" "$COLLECT/$r/report.html" 2>/dev/null || true
    run=$(basename "$(dirname "$cert")")
    [ -d "$DGR_WORK/runs/$run" ] && cp -a "$DGR_WORK/runs/$run" "$COLLECT/$r/run"
    timed "verify-$r" to_file "$COLLECT/$r/verify.txt" dgr verify "$cert" || vrc=$?
  else
    vrc=-
  fi
  verdict=$(sed -n 's/^verdict: \([A-Z]*\).*/\1/p' "$COLLECT/$r/certify.txt" | tail -1)
  printf '%s\t%s\t%s\t%s\t%s\n' "$r" "${verdict:-NONE}" "$rc" "$vrc" "$cert" >>"$RESULTS"
  return 0  # a FAIL (exit 5) or an error is collected; the next recipe still runs
}

# The ring floor: how fast N stage processes decode here with no gRPC, protobuf or driver between them
# (worker/README.md, "Ring decode").  Figures only; a failure is logged and changes no exit code.
ring_floor() {
  local tool model n budget
  tool=$(ls -t "$DGR_WORK"/build/"$LANE"-*/bin/dgr-ring-floor 2>/dev/null | head -1)
  model=$DGR_STORE/tiny-llama/f32/tiny-llama-f32-00001-of-00003.gguf
  if [ -z "$tool" ] || [ ! -f "$model" ]; then say "ring floor: no tool or no tiny-llama; skipped"; return 0; fi
  for n in 1 2 4 12; do
    budget=$(( $(left) - 15 ))
    if [ "$budget" -lt 30 ]; then say "ring floor: ${budget}s left; stopped before $n stages"; return 0; fi
    timeout -k 5 "$budget" "$tool" -m "$model" --stages "$n" --gpu-layers 999 >>"$COLLECT/ring-floor.jsonl" \
      || say "ring floor: $n stages failed (exit $?)"
  done
  cat "$COLLECT/ring-floor.jsonl" 2>/dev/null || true
}

collect() {
  local b f
  mkdir -p "$COLLECT/builds" "$COLLECT/keys" "$COLLECT/provenance"
  for b in "$DGR_WORK"/build/*/build.json; do [ -f "$b" ] && cp "$b" "$COLLECT/builds/$(basename "$(dirname "$b")").build.json"; done
  cp "$DGR_WORK"/keys/*.pub.pem "$COLLECT/keys/" 2>/dev/null || true
  for f in "$DGR_WORK"/src/*.provenance.json "$DGR_WORK"/patched/*.provenance.json; do [ -f "$f" ] && cp "$f" "$COLLECT/provenance/"; done
  for f in "$DGR_STORE"/*/*/provenance.json; do
    [ -f "$f" ] && cp "$f" "$COLLECT/provenance/store-$(basename "$(dirname "$(dirname "$f")")")-$(basename "$(dirname "$f")").json"
  done
  cp "$BUNDLE/BUNDLE.json" "$COLLECT/provenance/BUNDLE.json"
  "$PY0" - "$RESULTS" "$TIMINGS" "$OUT_DIR/summary.json" "$LANE" "$DRY_RUN" "$(secs "$T0")" \
      "${DGR_CUDA_ARCHITECTURES:-}" "$PY" "$(bundle_field project.commit)" <<'EOF'
import json, sys
results, timings, out, lane, dry, total, arch, py, commit = sys.argv[1:]
def rows(path):
    try:
        return [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
    except FileNotFoundError:
        return []
summary = {
    "kind": "dgr.device-run", "schema_version": 1, "lane": lane, "dry_run": dry == "1",
    "project_commit": commit, "cuda_architectures": arch or None, "python": py, "seconds": float(total),
    "steps": [{"step": s, "seconds": float(t), "exit": int(rc)} for s, t, rc in rows(timings)],
    "recipes": [{"recipe": r, "verdict": v, "certify_exit": c, "verify_exit": ve, "certificate": p or None}
                for r, v, c, ve, p in rows(results)],
}
json.dump(summary, open(out, "w"), indent=2)
EOF
  cp "$TIMINGS" "$OUT_DIR/summary.json" "$COLLECT/"
}

main() {
  : >"$TIMINGS"; : >"$RESULTS"
  rm -rf "$WORK/collect"; mkdir -p "$COLLECT"
  timed probe probe || true
  timed bundle-check "$PY0" -m device verify "$BUNDLE" || return 3
  [ ${#RECIPES[@]} -gt 0 ] || read -r -a RECIPES <<<"$(bundle_field recipes)"
  say "recipes: ${RECIPES[*]} on lane $LANE"
  timed python python_env || return 6
  timed sysroot sysroot_env || return 6
  timed fetch tree || return 6
  timed patch dgr patch || return 6
  dgr doctor >"$COLLECT/doctor.txt" 2>&1 || true; cat "$COLLECT/doctor.txt"
  if [ "$DRY_RUN" = 1 ]; then
    timed provision provision || return 6
    say "dry run: not running these:"
    [ "$LANE" = cuda ] && echo "  nvidia-smi --query-gpu=compute_cap --format=csv,noheader -> DGR_CUDA_ARCHITECTURES"
    [ "$LANE" = cuda ] && echo "  python -m device build --lane cuda -j $JOBS   (at the same time as the next)"
    echo "  python -m device build --lane cpu -j $JOBS"
    local r; for r in "${RECIPES[@]}"; do echo "  dgr certify --recipe $r --lane $LANE; dgr verify <its certificate>"; done
    echo "  dgr-ring-floor -m tiny-llama --stages 1|2|4|12 --gpu-layers 999 (the time left)"
    return 0
  fi
  if [ "$LANE" = cuda ]; then timed gpu gpu_arch || return 6; fi
  timed builds builds || return 6
  local r; for r in "${RECIPES[@]}"; do certify_one "$r"; done
  timed ring-floor ring_floor || true
  # the exit code: 6 when a recipe errored or did not verify, else 5 when a gate failed, else 0
  awk -F'\t' '$2=="PASS" && $3==0 && $4==0 {next} $2=="SKIPPED" {bad=1; next}
              $2=="FAIL" && $3==5 && $4==0 {fail=1; next} {bad=1}
              END {exit bad ? 6 : (fail ? 5 : 0)}' "$RESULTS"
}

run_all() {
  local rc=0
  main || rc=$?
  collect || true
  say "device-cuda.sh: exit $rc after $(secs "$T0") s (log $OUT_DIR/log.txt, results $OUT_DIR/results.tar.gz)"
  return "$rc"
}

: >"$OUT_DIR/log.txt"
set +e
run_all 2>&1 | tee -a "$OUT_DIR/log.txt"
rc=${PIPESTATUS[0]}
set -e
cp "$OUT_DIR/log.txt" "$COLLECT/log.txt" 2>/dev/null || true
tar -czf "$OUT_DIR/results.tar.gz" -C "$(dirname "$COLLECT")" results
exit "$rc"
