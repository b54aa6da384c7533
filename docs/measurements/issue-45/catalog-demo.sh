#!/bin/bash
# dgr catalog / verify / admit over the real certificates a fresh-clone test run left in its workspace.
set -u
CLONE=${1:-/tmp/ci-busy}
OUT=${2:-/tmp/catalog-demo}
rm -rf "$OUT"; mkdir -p "$OUT"
cd /work/main
export DGR_WORK=$CLONE/.work
run() { echo "\$ $*"; "$@"; echo "exit $?"; echo; }
DGR=/tmp/dev-venv/bin/dgr
run $DGR catalog "$DGR_WORK/reports" --out "$OUT/catalog.json"
run $DGR verify "$OUT/catalog.json"
python3 - "$OUT/catalog.json" <<'PY'
import base64, json, sys
doc = json.loads(base64.b64decode(json.load(open(sys.argv[1]))["payload"]))["predicate"]
for e in doc["entries"]:
    st = " | ".join(f"{s['layers'][0]}:{s['layers'][1]} w={s['weight_bytes']} kv/tok={s['kv_bytes_per_token']}" for s in e["stages"])
    print(f"{e['lane']:7} {e['recipe']:18} {e['hardware_class']:10} {e['placement']:22} {st}")
print("failures:", len(doc["failures"]), "refused:", len(doc["refused"]))
PY
DIGEST=$(python3 -c "import json,base64,sys; d=json.loads(base64.b64decode(json.load(open('$OUT/catalog.json'))['payload']))['predicate']; print([e for e in d['entries'] if e['recipe']=='tiny-llama' and e['placement']=='two-middle'][0]['identity']['artifacts']['manifest_digest'])")
run $DGR admit --catalog "$OUT/catalog.json" --recipe tiny-llama --lane cpu --layers 0:6,6:12
run $DGR admit --catalog "$OUT/catalog.json" --recipe tiny-llama --lane cpu --layers 0:5,5:12
run $DGR admit --catalog "$OUT/catalog.json" --recipe tiny-llama --lane cpu --layers 0:6,6:12 --artifacts-digest 0000000000000000000000000000000000000000000000000000000000000000
cp "$OUT/catalog.json" "$OUT/tampered.json"
python3 - "$OUT/tampered.json" <<'PY'
import base64, json, sys
env = json.load(open(sys.argv[1]))
env["payload"] = base64.b64encode(base64.b64decode(env["payload"]).replace(b'"two-middle"', b'"two-middlf"', 1)).decode()
json.dump(env, open(sys.argv[1], "w"))
PY
run $DGR verify "$OUT/tampered.json"
