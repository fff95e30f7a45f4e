# The DDP tutorial's minGPT (pytorch/examples distributed/minGPT-ddp, mingpt/model.py) in PyTorch, module for
# module with its names and its initialisation, shared by make_gpt_reference.py (test data for nn::GPT) and
# bench/gpt_cpu/torch_step.py (the speed comparison). One change: the attention mask given to
# torch.nn.MultiheadAttention is a BOOL mask (True = may not attend), so the model is causal. The tutorial passes
# its float tril, which MultiheadAttention adds to the scores, so the tutorial's model is not causal (a known
# defect; ddp's GPT is causal, nn/gpt.hpp).
# config: any object with vocab_size, block_size, n_layer, n_head, n_embd, embd_pdrop, resid_pdrop, attn_pdrop.
# SPDX-License-Identifier: MIT
import math

import torch
import torch.nn.functional as F

nn = torch.nn


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
    """ddp's name for the tutorial's parameter `name` (they differ only inside MultiheadAttention)."""
    return (name.replace("attn.attn.in_proj_weight", "attn.attn.c_attn.weight")
            .replace("attn.attn.in_proj_bias", "attn.attn.c_attn.bias")
            .replace("attn.attn.out_proj.", "attn.attn.c_proj."))


def optimizer_groups(model, weight_decay):
    """The tutorial's create_optimizer groups: decay on Linear weights and MultiheadAttention's in_proj_weight,
    none on biases, LayerNorm and Embedding weights and pos_emb (ddp: optim::linear_weight_decay_groups)."""
    decay = set()
    for mn, m in model.named_modules():
        for pn, _ in m.named_parameters(recurse=False):
            if (pn == "weight" and isinstance(m, nn.Linear)) or pn == "in_proj_weight":
                decay.add(f"{mn}.{pn}" if mn else pn)
    params = dict(model.named_parameters())
    return [{"params": [params[n] for n in sorted(decay)], "weight_decay": weight_decay},
            {"params": [params[n] for n in sorted(params.keys() - decay)], "weight_decay": 0.0}]
