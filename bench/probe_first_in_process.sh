#!/usr/bin/env bash
# A test first in its process against the same test after another (timm's
# convnextv2_tiny backward, on CUDA; .thirdparty/timm carried): figures and
# site lists from each run's JSON report, printed.  OUT: where the reports go.
set -u
cd "$(dirname "$0")/.."
export MEMLAB_CORE=bridge PYTHONUNBUFFERED=1 MEMLAB_NO_INSTALL=1
python3 -m pip install --no-build-isolation --no-deps --no-index -e . >/dev/null 2>&1 || echo build failed
cd .thirdparty/timm
B="tests/test_models.py::test_model_backward[2-convnextv2_tiny]"
F="tests/test_models.py::test_model_forward[1-convnextv2_tiny]"
C="tests/test_models.py::test_model_backward[2-convnext_tiny]"
export TORCH_DEVICE=cuda
python3 -m pytest -q -p no:cacheprovider -p no:randomly "$B" --memlab-baseline=$OUT/bl.json --memlab-update-baseline --memlab-json=$OUT/alone.json 2>&1 | tail -3
python3 -m pytest -q -p no:cacheprovider -p no:randomly "$F" "$B" --memlab-baseline=$OUT/bl.json --memlab-json=$OUT/after_fwd.json 2>&1 | tail -25
python3 -m pytest -q -p no:cacheprovider -p no:randomly "$C" "$B" --memlab-baseline=$OUT/bl.json --memlab-json=$OUT/after_bwd.json 2>&1 | tail -25
python3 - <<'PY'
import json, os
for n in ("alone", "after_fwd", "after_bwd"):
    d = json.load(open(os.path.join(os.environ["OUT"], n + ".json")))
    for t in d["tests"]:
        for dev, f in t["devices"].items():
            print(n, t["nodeid"].split("::")[-1], dev, {k: f.get(k) for k in ("peak", "peak_total", "kept", "first_use", "peak_with_kept", "baseline")})
            for s in (f.get("site_changes") or [])[:6]:
                print("    change", s)
            for s in (f.get("sites") or [])[:6]:
                print("    site", s)
            print("    held", f.get("first_use_held"))
PY
