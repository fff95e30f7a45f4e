#!/usr/bin/python3
# PyTorch side of bench_gpt_cpu: times one training step of the DDP tutorial's minGPT (the model of
# tests/interop/reference/gpt_torch_model.py) for one configuration and prints {"torch_step_s": median, ...} as one JSON
# line. The step is the tutorial trainer's: forward on int64 ids (B, T), mean cross-entropy over the B*T
# positions, backward, clip_grad_norm_(1.0), AdamW(lr 3e-4, betas (0.9, 0.95)) with its decay groups (0.1).
# Dropout embd_pdrop = resid_pdrop = 0.1 as the tutorial's; attn_pdrop = 0 (the tutorial's is 0.1, but the
# published numbers predate ddp's attention dropout, so both sides leave it out).
# "torch_peak_step_mib": ru_maxrss after the steps minus ru_maxrss before the first (warm-up) step, MiB: what the
# steps added to the process's peak resident memory (gradients, AdamW state, activations, allocator slack).
# Usage: torch_step.py N_LAYER N_HEAD N_EMBD BLOCK_SIZE VOCAB BATCH THREADS REPEATS   (exits 77 without torch)
# SPDX-License-Identifier: MIT
import json
import os
import resource
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # depends on the machine
    print(json.dumps({"error": f"torch not importable: {e}"}))
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "interop", "reference"))
from gpt_torch_model import GPT, optimizer_groups  # noqa: E402  (the model make_gpt_reference.py checks against)

n_layer, n_head, n_embd, block_size, vocab, batch, threads, repeats = map(int, sys.argv[1:9])


class Config:
    pass


cfg = Config()
cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd = vocab, block_size, n_layer, n_head, n_embd
cfg.embd_pdrop = cfg.resid_pdrop = 0.1
cfg.attn_pdrop = 0.0
torch.set_num_threads(threads)
torch.manual_seed(0)
model = GPT(cfg)
model.train()
opt = torch.optim.AdamW(optimizer_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95))
ids = torch.randint(0, vocab, (batch, block_size))
targets = torch.randint(0, vocab, (batch, block_size))


def step():
    opt.zero_grad(set_to_none=True)  # the tutorial trainer's model.zero_grad(set_to_none=True)
    _, loss = model(ids, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
step()  # warm-up (allocations, optimizer state)
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"torch_step_s": statistics.median(times), "torch_step_times": times,
                  "torch_peak_step_mib": (rss1 - rss0) / 1024, "torch_version": torch.__version__}))
