#!/bin/bash
# Issue 45's must-show as a user runs it: `dgr certify` of tiny-llama, tiny-v4 and gemma3-270m-q4 on the
# CPU lane (this checkout, DGR_WORK's lanes and store), then one catalog of those three certificates and
# the repository's two lavapipe ones (evidence/, signed by another workspace's dev key: --key), checked
# against its schema with jsonschema, `dgr verify`, three `dgr admit` proposals and a tampered copy.
# Usage: catalog-recipes.sh OUT (needs DGR_WORK; takes about 8 minutes on the 2-core box); with
# CERTS="A B C" set, those certificates stand for the three certifications (nothing is certified).
set -u
OUT=${1:?usage: catalog-recipes.sh OUT}
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
DGR=${DGR:-dgr}
mkdir -p "$OUT"
run() { echo "\$ $*"; "$@"; echo "exit $?"; echo; }
read -r -a certs <<< "${CERTS:-}"
for recipe in tiny-llama tiny-v4 gemma3-270m-q4; do
  [ -n "${CERTS:-}" ] && break
  start=$(date +%s)
  run "$DGR" certify --recipe "$recipe" > "$OUT/certify-$recipe.log" 2>&1
  echo "dgr certify --recipe $recipe: $(( $(date +%s) - start )) s, $(tail -2 "$OUT/certify-$recipe.log" | head -1)"
  newest=$(ls -d "$DGR_WORK/reports/$recipe/cpu"/*/ | sort | tail -1)
  certs+=("${newest}certificate.json")
done
EV="$HERE/evidence"
run "$DGR" catalog "${certs[@]}" "$EV/tiny-llama-vulkan-lavapipe-gates/certificate.json" \
  "$EV/tiny-llama-vulkan-lavapipe/certificate.json" \
  --key "$EV/tiny-llama-vulkan-lavapipe-gates/signing-key.pub.pem" \
  --key "$EV/tiny-llama-vulkan-lavapipe/signing-key.pub.pem" --out "$OUT/catalog.json"
run "$DGR" verify "$OUT/catalog.json"
python3 - "$OUT/catalog.json" "$HERE/manifests/schemas/catalog.schema.json" <<'PY'
import base64, json, sys
import jsonschema
statement = json.loads(base64.b64decode(json.load(open(sys.argv[1]))["payload"]))
doc = statement["predicate"]
jsonschema.validate(doc, json.load(open(sys.argv[2])))
print("jsonschema: the catalog's predicate is valid against manifests/schemas/catalog.schema.json")
for e in doc["entries"]:
    st = " | ".join(
        f"{s['layers'][0]}:{s['layers'][1]} w={s['weight_bytes']} kv/tok="
        + (f"{s['kv_bytes_per_token']:.1f} ({s['kv_bytes_per_token_from']})" if s["kv_bytes_per_token"] else "none")
        for s in e["stages"]
    )
    print(f"{e['lane']:7} {e['recipe']:15} {e['hardware_class']:16} {e['placement']:20} {st}")
for f in doc["failures"]:
    print(f"FAIL {f['lane']} {f['recipe']} {f['placement']}: {'; '.join(f['reasons'])}")
for r in doc["refused"]:
    print(f"refused {r['path']}: {r['reason']}")
PY
echo
run "$DGR" admit --catalog "$OUT/catalog.json" --recipe tiny-llama --lane cpu --layers 0:6,6:12
run "$DGR" admit --catalog "$OUT/catalog.json" --recipe tiny-llama --lane cpu --layers 0:5,5:12
run "$DGR" admit --catalog "$OUT/catalog.json" --recipe tiny-llama --lane cpu --layers 0:6,6:12 \
  --artifacts-digest 0000000000000000000000000000000000000000000000000000000000000000
cp "$OUT/catalog.json" "$OUT/tampered.json"
python3 - "$OUT/tampered.json" <<'PY'
import base64, json, sys
env = json.load(open(sys.argv[1]))
payload = base64.b64decode(env["payload"]).replace(b'"two-middle"', b'"two-middlf"', 1)
env["payload"] = base64.b64encode(payload).decode()
json.dump(env, open(sys.argv[1], "w"))
PY
run "$DGR" verify "$OUT/tampered.json"
