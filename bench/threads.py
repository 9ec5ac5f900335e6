"""A training step's time alone and beside busy processes, with OpenMP's threads spinning or sleeping.

Each measurement is a fresh process (OpenMP reads OMP_WAIT_POLICY once, when torch starts it) timing
MiniLM training steps (forward, backward, fused AdamW) on real SST-2 sentences, batch 32, at the
precision `mixed_precision=auto` takes on the machine (bf16 autocast where bf16 is native, else fp32),
with torch's default thread count, for each way idle OpenMP threads may wait (`WAITS`). "Beside busy
processes" starts one pure-Python busy loop per core first, as a second job on the same machine would
be. Modes alternate; median of the repeats.

    python bench/threads.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The child: `steps` timed MiniLM training steps; prints ms per step and the thread count.
STEP = """
import sys, time, torch
from bert_tasks.modeling.load import load_model, load_tokenizer
from bert_tasks.runtime import resolve_mixed_precision
bf16 = resolve_mixed_precision("auto") == "bf16"
texts = [line.split("\\t")[0] for line in open(sys.argv[1], encoding="utf-8").read().splitlines()[1:33]]
tokenizer = load_tokenizer()
batch = tokenizer(texts, padding=True, return_tensors="pt")
labels = torch.tensor([i % 2 for i in range(len(texts))])
model = load_model("all-MiniLM-L6-v2", "sentiment", ["negative", "positive"]).train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch, labels=labels).loss
    loss.backward(); optimizer.step(); optimizer.zero_grad()
for _ in range(3):
    step()
start = time.perf_counter()
for _ in range(int(sys.argv[2])):
    step()
print((time.perf_counter() - start) / int(sys.argv[2]) * 1000, torch.get_num_threads())
"""
BUSY = "while True: pass"


#: How idle OpenMP threads wait: GNU OpenMP's default (spin ~3 ms, then sleep), shorter spins, no spin.
WAITS = {
    "spinning (OpenMP's default)": {},
    "spin 100,000 then sleep": {"GOMP_SPINCOUNT": "100000"},
    "spin 3,000 then sleep (the CLI's)": {"GOMP_SPINCOUNT": "3000"},
    "sleeping at once (PASSIVE)": {"OMP_WAIT_POLICY": "PASSIVE"},
}


def measure(wait: dict[str, str], busy: bool, steps: int) -> tuple[float, int]:
    env = {
        key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    }
    env.update(wait)
    hogs = (
        [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(os.cpu_count() or 1)] if busy else []
    )
    try:
        data = REPO.parent / "shared" / "data" / "sst2" / "dev.tsv"
        out = subprocess.run(
            [sys.executable, "-c", STEP, str(data), str(steps)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    ms, threads = out.stdout.split()
    return float(ms), int(threads)


def cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    modes = [(name, busy) for busy in (False, True) for name in WAITS]
    times: dict[tuple[str, bool], list[float]] = {mode: [] for mode in modes}
    threads = 0
    for _ in range(args.repeats):
        for name, busy in modes:
            ms, threads = measure(WAITS[name], busy, args.steps)
            times[name, busy].append(ms)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores, torch threads {threads}")
    print("| neighbours | OpenMP waits | ms per step (median) | runs | vs spinning |")
    print("| --- | --- | ---: | --- | ---: |")
    default = next(iter(WAITS))
    for name, busy in modes:
        runs = times[name, busy]
        base = statistics.median(times[default, busy])
        where = f"{os.cpu_count()} busy processes" if busy else "none"
        cells = ", ".join(f"{value:.0f}" for value in runs)
        ratio = base / statistics.median(runs)
        print(f"| {where} | {name} | {statistics.median(runs):.0f} | {cells} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
