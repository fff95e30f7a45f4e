#!/usr/bin/python3
# Writes PyTorch reference data for nn::GPT, read by tests/reference/test_gpt_ops.cpp.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_gpt_reference.py OUT_FILE      (exits 77 when torch is not importable)
#
# The model is the DDP tutorial's minGPT (pytorch/examples distributed/minGPT-ddp, mingpt/model.py) written out
# module for module, with its names and its initialisation, and one change: the attention mask given to
# torch.nn.MultiheadAttention is a BOOL mask (True = may not attend), so the model is causal. The tutorial passes
# its float tril, which MultiheadAttention adds to the scores, so the tutorial's model is not causal (a known
# defect; ddp's GPT is causal, nn/gpt.hpp). Dropout 0. n_layer 2, n_head 4, n_embd 64, vocab 17, block_size 8;
# a batch of ids and targets (B 3, T 8); loss = mean cross-entropy over the B*T positions, as the tutorial's.
# After the tutorial's initialisation, the parameters it leaves constant (pos_emb and biases 0, LayerNorm weights
# 1) get N(0, 0.02^2) noise so that every parameter's value matters to the comparison.
# Records (reference_records.py's format): "gpt/<config>" ints, "gpt/ids", "gpt/targets" (int64), "gpt/logits",
# "gpt/loss" (1), and "gpt/param/<name>", "gpt/grad/<name>" for every parameter under ddp's name, which differs
# from the tutorial's only inside MultiheadAttention (in_proj_* -> c_attn.*, out_proj.* -> c_proj.*).
import math
import sys

from reference_records import Records, import_torch  # shared by the make_*_reference.py scripts

torch, F = import_torch(seed=2024)
nn = torch.nn
records = Records()
put = records.put


class Config:
    vocab_size, block_size, n_layer, n_head, n_embd = 17, 8, 2, 4, 64
    embd_pdrop = resid_pdrop = attn_pdrop = 0.0


class MultiheadAttentionLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.resid_drop = nn.Dropout(config.resid_pdrop)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.register_buffer("mask", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))
        self.attn = nn.MultiheadAttention(embed_dim=config.n_embd, num_heads=config.n_head,
                                          dropout=config.attn_pdrop, batch_first=True)

    def forward(self, x):
        _, seq_size, _ = x.size()
        # The tutorial: attn_mask=self.mask[0, 0, :seq_size, :seq_size] (float, added to the scores). Here: bool.
        y = self.attn(x, x, x, attn_mask=self.mask[0, 0, :seq_size, :seq_size] == 0)[0]
        return self.resid_drop(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.attn = MultiheadAttentionLayer(config)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd), nn.Dropout(config.resid_pdrop))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class EmbeddingStem(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, config.block_size, config.n_embd))
        self.drop = nn.Dropout(config.embd_pdrop)
        self.block_size = config.block_size

    def forward(self, idx):
        b, t = idx.size()
        assert t <= self.block_size
        return self.drop(self.tok_emb(idx) + self.pos_emb[:, :t, :])


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb_stem = EmbeddingStem(config)
        self.blocks = nn.Sequential(*[Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                p.data.normal_(mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)

    def forward(self, idx, targets):
        x = self.blocks(self.emb_stem(idx))
        logits = self.head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def ddp_name(name):
    return (name.replace("attn.attn.in_proj_weight", "attn.attn.c_attn.weight")
            .replace("attn.attn.in_proj_bias", "attn.attn.c_attn.bias")
            .replace("attn.attn.out_proj.", "attn.attn.c_proj."))


cfg = Config()
model = GPT(cfg)
with torch.no_grad():
    for p in model.parameters():
        if bool((p == p.flatten()[0]).all()):  # constant after init: pos_emb, biases, LayerNorm weights
            p.add_(torch.randn_like(p) * 0.02)
B, T = 3, 8
ids = torch.randint(0, cfg.vocab_size, (B, T))
targets = torch.randint(0, cfg.vocab_size, (B, T))
logits, loss = model(ids, targets)
loss.backward()

for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
    put("gpt/" + k, getattr(cfg, k))
put("gpt/ids", ids)
put("gpt/targets", targets)
put("gpt/logits", logits)
put("gpt/loss", loss.reshape(1))
names = []
for name, p in model.named_parameters():
    names.append(ddp_name(name))
    put("gpt/param/" + names[-1], p)
    put("gpt/grad/" + names[-1], p.grad)
put("gpt/num_params", len(names))

records.write(sys.argv[1])
