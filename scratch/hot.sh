# scratch: the per-test bracket in a hot loop on the GPU machine
cd "$(dirname "$0")/suite"
export PYTHONPATH="$PWD/..:$PYTHONPATH" MEMLAB_CORE=bridge
for cuda in 0 1; do
  echo "== HOT_CUDA=$cuda"
  HOT_CUDA=$cuda HOT_OUT=$OUT/full$cuda.txt python3 -m pytest -q -p no:cacheprovider -p hotfull test_hot.py --memlab 2>&1 | tail -1; cat $OUT/full$cuda.txt
  HOT_CUDA=$cuda HOT_OUT=$OUT/parts$cuda.txt python3 -m pytest -q -p no:cacheprovider -p hotparts test_hot.py --memlab 2>&1 | tail -1; cat $OUT/parts$cuda.txt
  HOT_CUDA=$cuda python3 -m pytest -q -p no:cacheprovider -p hotcount test_hot.py --memlab 2>&1 | tail -1; mv $OUT/calls.txt $OUT/calls$cuda.txt; head -1 $OUT/calls$cuda.txt
done
