#!/usr/bin/python3
# Writes PyTorch reference data for nn::GPT, read by tests/interop/reference/test_gpt_ops.cpp.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_gpt_reference.py OUT_FILE INIT_F32 INIT_F64   (exits 77 when torch is not importable)
#
# The model is the DDP tutorial's minGPT (pytorch/examples distributed/minGPT-ddp, mingpt/model.py), gpt_torch_model.py:
# module for module, with its names and its initialisation, and one change: the attention mask given to
# torch.nn.MultiheadAttention is a BOOL mask (True = may not attend), so the model is causal. The tutorial passes
# its float tril, which MultiheadAttention adds to the scores, so the tutorial's model is not causal (a known
# defect; ddp's GPT is causal, nn/gpt.hpp). Dropout 0. n_layer 2, n_head 4, n_embd 64, vocab 17, block_size 8;
# a batch of ids and targets (B 3, T 8); loss = mean cross-entropy over the B*T positions, as the tutorial's.
# After the tutorial's initialisation, the parameters it leaves constant (pos_emb and biases 0, LayerNorm weights
# 1) get N(0, 0.02^2) noise so that every parameter's value matters to the comparison.
# INIT_F32, INIT_F64: those initial weights as model.state_dict() saved with safetensors (safetensors_py.py) in
# float32 and in float64 (the same values), the tutorial's names and its mask buffers blocks.i.attn.mask included:
# what ddp loads with nn::mingpt_state_dict_key.
# Logits, loss and gradients are float32's, on batch 0. Then three training steps in float64 as the tutorial's
# trainer takes them, on three different batches (batch 0 first): zero_grad, forward, backward,
# torch.nn.utils.clip_grad_norm_(params, 1.0), step of the tutorial's optimizer (its create_optimizer:
# torch.optim.AdamW, betas (0.9, 0.95), eps 1e-8, two groups: weight_decay 0.1 on the weights of nn.Linear modules,
# MultiheadAttention's in_proj_weight and out_proj.weight included, 0 on the rest), with lr 1e-2 instead of its
# 3e-4 so that each step moves a weight by up to about 1e-2 (their init std is 0.02). The gradient norm before
# clipping is > 1 in every step (printed; the script fails if no step clips).
# Why float64 for the steps: AdamW's update is m / sqrt(v) per element, so an element's update has the relative
# error of that element's gradient, not the gradient's error relative to the whole tensor; elements whose gradient
# is at rounding level get an update of up to lr on either side in float32 (the key third of in_proj_bias has a
# gradient that is 0 in exact arithmetic: softmax ignores a constant added to every key). In float32 the parameters
# after three steps differ from torch's by up to 4e-3 relative for that reason; in float64 the gradients' rounding
# is far below eps and the comparison measures the optimizer and the clipping themselves.
# Records (reference_records.py's format): "gpt/<config>" ints, "gpt/logits" and "gpt/loss" (1) of batch 0,
# "gpt/grad/<name>" for every parameter under ddp's name (it differs from the tutorial's only inside
# MultiheadAttention: in_proj_* -> c_attn.*, out_proj.* -> c_proj.*); for the steps "gpt/lr", "gpt/weight_decay",
# "gpt/beta1", "gpt/beta2", "gpt/max_norm" (float64), "gpt/steps", "gpt/step<k>/ids", "gpt/step<k>/targets" (int64,
# k < steps; step 0's is the batch above), "gpt/grad_norms" (float64's norm before clipping, per step)
# and "gpt/trained/<name>", every float64 parameter after the last step.
import copy
import sys

from reference_records import Records, import_torch  # shared by the make_*_reference.py scripts

torch, F = import_torch(seed=2024)
from safetensors_py import save_file  # noqa: E402  (imports torch, so after import_torch's check)
from gpt_torch_model import GPT, ddp_name, optimizer_groups  # noqa: E402  (the tutorial's model, shared with bench/gpt_cpu)

records = Records()
put = records.put


class Config:
    vocab_size, block_size, n_layer, n_head, n_embd = 17, 8, 2, 4, 64
    embd_pdrop = resid_pdrop = attn_pdrop = 0.0


cfg = Config()
model = GPT(cfg)
with torch.no_grad():
    for p in model.parameters():
        if bool((p == p.flatten()[0]).all()):  # constant after init: pos_emb, biases, LayerNorm weights
            p.add_(torch.randn_like(p) * 0.02)
model64 = copy.deepcopy(model).double()
save_file(model.state_dict(), sys.argv[2])  # the initial weights, the tutorial's names, mask buffers included
save_file(model64.state_dict(), sys.argv[3])
B, T = 3, 8
ids = torch.randint(0, cfg.vocab_size, (B, T))
targets = torch.randint(0, cfg.vocab_size, (B, T))
logits, loss = model(ids, targets)
loss.backward()

for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
    put("gpt/" + k, getattr(cfg, k))
put("gpt/logits", logits)
put("gpt/loss", loss.reshape(1))
names = []
for name, p in model.named_parameters():
    names.append(ddp_name(name))
    put("gpt/grad/" + names[-1], p.grad)
put("gpt/num_params", len(names))


LR, WEIGHT_DECAY, BETAS, MAX_NORM, STEPS = 1e-2, 0.1, (0.9, 0.95), 1.0, 3
optimizer = torch.optim.AdamW(optimizer_groups(model64, WEIGHT_DECAY), lr=LR, betas=BETAS)
norms = []
for k in range(STEPS):
    if k > 0:  # step 0 trains on the batch above
        ids = torch.randint(0, cfg.vocab_size, (B, T))
        targets = torch.randint(0, cfg.vocab_size, (B, T))
    put(f"gpt/step{k}/ids", ids)
    put(f"gpt/step{k}/targets", targets)
    optimizer.zero_grad()
    model64(ids, targets)[1].backward()
    norms.append(float(torch.nn.utils.clip_grad_norm_(model64.parameters(), MAX_NORM)))
    optimizer.step()
print("gradient norms before clipping:", norms)
if not any(n > MAX_NORM for n in norms):
    sys.exit(f"no step clipped (norms {norms} <= max_norm {MAX_NORM}): lower MAX_NORM")
for k, v in (("lr", LR), ("weight_decay", WEIGHT_DECAY), ("beta1", BETAS[0]), ("beta2", BETAS[1]),
             ("max_norm", MAX_NORM)):
    put("gpt/" + k, torch.tensor([v], dtype=torch.float64))  # a Python float would be put as float32
put("gpt/steps", STEPS)
put("gpt/grad_norms", torch.tensor(norms, dtype=torch.float64))
for name, p in model64.named_parameters():
    put("gpt/trained/" + ddp_name(name), p)

records.write(sys.argv[1])

