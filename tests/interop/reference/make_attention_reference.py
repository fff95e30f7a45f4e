#!/usr/bin/python3
# Writes PyTorch reference data for nn::CausalSelfAttention, read by tests/interop/reference/test_attention_ops.cpp.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_attention_reference.py OUT_FILE      (exits 77 when torch is not importable)
#
# The module is karpathy/minGPT's CausalSelfAttention (mingpt/model.py) written out with torch ops, dropout 0:
# c_attn, split into q, k, v, heads (B, nh, T, hs), masked softmax(q k^T / sqrt(hs)), att v, heads side by side,
# c_proj. One case: B = 2, T = 5 (< block_size = 8), C = 16, n_head = 4, float32, torch.nn.Linear's default
# initialisation. File format: reference_records.py's (records "attn/<tensor>", float32 values stored as float64).
import math
import sys

from reference_records import Records, import_torch  # shared by these scripts

torch, F = import_torch(seed=4321)
records = Records()
put = records.put


class CausalSelfAttention(torch.nn.Module):
    """minGPT's layer (attn_pdrop = resid_pdrop = 0, so its two Dropouts are identities and left out)."""

    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = torch.nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = torch.nn.Linear(n_embd, n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


B, T, C, n_head, block_size = 2, 5, 16, 4, 8
m = CausalSelfAttention(C, n_head, block_size)
x = torch.randn(B, T, C).requires_grad_(True)
y = m(x)
dy = torch.randn_like(y)
y.backward(dy)

put("attn/n_head", n_head)
put("attn/block_size", block_size)
put("attn/x", x)
put("attn/y", y)
put("attn/dy", dy)
put("attn/dx", x.grad)
for name, p in m.named_parameters():  # c_attn.weight, c_attn.bias, c_proj.weight, c_proj.bias
    put("attn/" + name, p)
    put("attn/grad/" + name, p.grad)

records.write(sys.argv[1])
