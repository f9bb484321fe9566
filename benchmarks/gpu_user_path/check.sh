#!/bin/bash
# Run on a GPU box from the repository root: bash benchmarks/gpu_user_path/check.sh (OUT=folder for its files).
# Not yet run on a GPU (the device lent to this work ran another checkout).
# Device check for issue 32 (the GPU user's path): each step under its own timeout, output to $OUT.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=4
O=${OUT:-/tmp/out}; mkdir -p $O
step() { echo "=== $1"; shift; timeout 90 "$@" > >(tail -25) 2> >(grep -v USDT | tail -25 >&2); echo "rc=$?"; }
step env bash -c 'id -u; nvidia-smi -L; which ncu; python -c "import torch,pynvml,numpy;print(torch.__version__,torch.cuda.is_available())"'
step "trace torchrun 1 rank (nccl)" python -m emo.cli trace -o $O/trace --wait 2 --warmup 1 --active 2 -- torchrun --nproc_per_node 1 benchmarks/gpu_user_path/train_cuda.py 1000
python - <<PY
import gzip, json, glob
for f in glob.glob("$O/trace/*.json.gz"):
    d = json.load(gzip.open(f)); ev = d["traceEvents"]
    k = [e for e in ev if e.get("cat") == "kernel"]
    print(f, "kernels", len(k), "sync", sum(e.get("cat") == "cuda_sync" for e in ev), "distinct", len({e['name'] for e in k}))
for f in glob.glob("$O/trace/emo-capture/*.json"): print(open(f).read()[:400])
PY
step "measure" python -c "
import emo, torch
x = torch.randn(8192, 8192, device='cuda')
with emo.measure() as w:
    for _ in range(50): x @ x
print('measure', w.result)"
echo "=== ncu process-wide window"
EMO_PROFILE_ITERATION=2 EMO_ITERATIONS=4 EMO_STOP=1 PYTHONPATH=$PWD/emo/_site:$PWD timeout 150 ncu --replay-mode kernel --metrics sm__cycles_active.sum --csv --target-processes all --profile-from-start off python benchmarks/gpu_user_path/train_cuda.py 100 > $O/ncu.csv 2> $O/ncu.err; echo "rc=$?"
tail -5 $O/ncu.err; grep -v '^"' $O/ncu.csv | tail -8
python - <<PY
import csv, io
rows = [r for r in csv.DictReader(io.StringIO("\n".join(l for l in open("$O/ncu.csv") if l.startswith('"'))))]
names = [r.get("Kernel Name", "?") for r in rows]
print("ncu profiled", len(rows), "kernels")
for n in names: print("  ", n[:110])
PY
step "apply static 1200" bash -c "python -c \"
from emo.policy import FrequencyPolicy as F; F.static('h200', 1, 1200).save('$O/p.json')\" && python -m emo.cli apply --policy $O/p.json -- python benchmarks/gpu_user_path/train_cuda.py 300"
step "reset" python -m emo.cli reset-clocks
