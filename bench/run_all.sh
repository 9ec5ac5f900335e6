#!/usr/bin/env bash
# Runs every benchmark in sequence on a quiet machine (2 cores: one at a time, nothing else running);
# each writes bench/results/<name>.json and .log. Takes about 5 hours on 2 CPU cores.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
run() {
  local name=$1; shift
  echo "== $name: $*" >&2
  /usr/bin/time -f "$name wall %e s, max RSS %M KB" "$@" --json "bench/results/$name.json" > "bench/results/$name.log" 2>&1
  tail -1 "bench/results/$name.log" >&2
}
run levers python bench/levers.py
run attention python bench/attention.py --repeats 4
run prepacked python bench/prepacked_linear.py
python bench/attention_groups.py > bench/results/attention_groups.log 2>&1
run finetune_sentiment python bench/finetune_sentiment.py --repeats 3
OMP_NUM_THREADS=1 taskset -c 1 python bench/profile_step.py > bench/results/profile_step.log 2>&1
python bench/profile_step.py --compare --compile-layers > bench/results/profile_step_compare.log 2>&1
python bench/profile_step.py --compare --shape 32x128 --repeats 3 > bench/results/profile_step_32x128.log 2>&1
run finetune_sentiment_quality python bench/finetune_sentiment.py --quality --output-dir runs/sentiment_sst2
run finetune_ner_bc5cdr python bench/finetune_ner.py --corpus bc5cdr --output-dir runs/ner_bc5cdr
run finetune_ner_speed python bench/finetune_ner.py --corpus bc5cdr --baseline tuned --max-train-samples 2000 --epochs 1
run startup python bench/startup.py --repeats 5
run predict_speed python bench/predict_speed.py --sentiment-model runs/sentiment_sst2 --ner-model runs/ner_bc5cdr
run precision python bench/precision.py --sentiment-model runs/sentiment_sst2 --sentiment-data ../shared/data/sst2/dev.tsv \
  --ner-model runs/ner_bc5cdr --ner-data ../shared/data/bc5cdr/test.tsv
run finetune_ner_ncbi_disease python bench/finetune_ner.py --corpus ncbi_disease
run finetune_ner_conll2003 python bench/finetune_ner.py --corpus conll2003 --set document_context=0
python bench/document_context.py --conll ../shared/data/conll2003/train.txt > bench/results/document_context.log 2>&1
run ablation_bc5cdr python bench/ablation.py --corpus bc5cdr --train-rows 2000 --test-rows 2000
run ablation_ncbi_disease python bench/ablation.py --corpus ncbi_disease --train-rows 2000
run prune python bench/prune.py
run ship_small python bench/ship_small.py --png bench/figures/ship_small.png
