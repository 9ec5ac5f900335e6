"""A training step's time alone and beside busy processes, with OpenMP's threads spinning or sleeping.

Each measurement is a fresh process (OpenMP reads OMP_WAIT_POLICY once, when torch starts it) timing
MiniLM training steps (forward, backward, fused AdamW) on real SST-2 sentences, batch 32, with torch's
default thread count. "Beside busy processes" starts one pure-Python busy loop per core first, as a
second job on the same machine would be. Modes alternate; median of the repeats.

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
texts = [line.split("\\t")[0] for line in open(sys.argv[1], encoding="utf-8").read().splitlines()[1:33]]
tokenizer = load_tokenizer()
batch = tokenizer(texts, padding=True, return_tensors="pt")
labels = torch.tensor([i % 2 for i in range(len(texts))])
model = load_model("all-MiniLM-L6-v2", "sentiment", ["negative", "positive"]).train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
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


def measure(policy: str | None, busy: bool, steps: int) -> tuple[float, int]:
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
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
    modes = [(policy, busy) for busy in (False, True) for policy in (None, "PASSIVE")]
    times: dict[tuple[str | None, bool], list[float]] = {mode: [] for mode in modes}
    threads = 0
    for _ in range(args.repeats):
        for mode in modes:
            ms, threads = measure(*mode, args.steps)
            times[mode].append(ms)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores, torch threads {threads}")
    print("| neighbours | OpenMP waits | ms per step (median) | runs | vs spinning |")
    print("| --- | --- | ---: | --- | ---: |")
    for policy, busy in modes:
        runs = times[policy, busy]
        base = statistics.median(times[None, busy])
        where = f"{os.cpu_count()} busy processes" if busy else "none"
        wait = "sleeping (PASSIVE, the CLI's)" if policy else "spinning (OpenMP's default)"
        cells = ", ".join(f"{value:.0f}" for value in runs)
        ratio = base / statistics.median(runs)
        print(f"| {where} | {wait} | {statistics.median(runs):.0f} | {cells} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
