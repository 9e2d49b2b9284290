#!/usr/bin/env python3
"""The PyTorch twin of `localsgd_models::gpt::Gpt`, and the parity data of
models/tests/it/model_gpt.rs.

`GPT` is nanoGPT's decoder-only transformer without weight tying and without dropout, with a bias
in every Linear (the head `lm_head` included) and in every LayerNorm (eps 1e-5):

  x = wte(tokens) + wpe(positions)
  for each block h.{i}:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
      attn: c_attn (d -> 3d), split q, k, v, heads, softmax(q k^T / sqrt(head_dim), causal) v,
            merge heads, c_proj (d -> d)
      mlp:  c_fc (d -> 4d), exact GELU (erf form, nn.GELU()), c_proj (4d -> d)
  logits = lm_head(ln_f(x))

Its `state_dict` names and layouts (Linear weights [out, in]) are what the Rust side reads and
writes. Initialization as nanoGPT: Linear and Embedding weights N(0, 0.02), the residual
projections (`attn.c_proj`, `mlp.c_proj`) N(0, 0.02 / sqrt(2 * layers)), biases 0, LayerNorm
weight 1 and bias 0.

`main` writes, from torch.manual_seed(0), one thread, float32, CPU:

  models/tests/data/gpt_twin_init.safetensors   the initial weights
  models/tests/data/gpt_twin_final.safetensors  the weights after 20 AdamW steps
  models/tests/data/gpt_twin.json               the config, the batches (windows of
                                                 context + 1 bytes of a fixed paragraph), the
                                                 forward loss at the initial weights on batch 0
                                                 and the loss of each of the 20 AdamW steps
                                                 (lr 1e-3, betas 0.9/0.999, eps 1e-8,
                                                 weight_decay 0.01; step s trains on batch s)

Needs only torch (the safetensors writer is inline). Rerun after changing the model:
python3 scripts/gpt_twin.py
"""

import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT_DIR = os.path.join(ROOT, "models", "tests", "data")

CONFIG = dict(vocab=256, context=16, d_model=32, heads=4, layers=2)
BATCH, STEPS, SEED = 4, 20, 0
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

# The batches' source: a fixed paragraph (plain ASCII), so the data never changes with the
# repository's files.
TEXT = (
    "Local SGD lets every worker take several optimizer steps on its own shard of the data "
    "before the workers meet to average their models. Between two meetings nothing crosses the "
    "network, so a slow link costs little. DiLoCo goes further: each worker runs hundreds of "
    "inner AdamW steps, and an outer Nesterov step moves the shared model along the average of "
    "the workers' progress. A small byte-level transformer trained on plain English text is the "
    "workload these methods were made for; it needs no tokenizer and no download."
).encode("ascii")


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        assert d_model % heads == 0
        self.heads = heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(future, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln_2 = nn.LayerNorm(d_model, eps=1e-5)
        self.mlp = MLP(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=256, context=64, d_model=128, heads=4, layers=2):
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(context, d_model)
        self.h = nn.ModuleList([Block(d_model, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.lm_head = nn.Linear(d_model, vocab)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens):
        """Logits [B, T, vocab] for tokens [B, T] (T <= context)."""
        _, t = tokens.shape
        assert t <= self.context, f"{t} tokens, context {self.context}"
        pos = torch.arange(t, device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def window_loss(self, windows):
        """Mean next-byte cross-entropy (nats) of windows [B, T + 1]."""
        logits = self(windows[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1))


def write_safetensors(path, tensors):
    """Minimal safetensors writer (F32): 8-byte LE header size, JSON header, raw data."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def batches():
    """STEPS batches of BATCH windows of context + 1 bytes of TEXT, at fixed strided offsets."""
    width = CONFIG["context"] + 1
    starts = len(TEXT) - width + 1
    out = []
    for s in range(STEPS):
        rows = []
        for b in range(BATCH):
            start = (37 * (s * BATCH + b)) % starts
            rows.append(list(TEXT[start:start + width]))
        out.append(rows)
    return out


def main():
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = GPT(**CONFIG)
    os.makedirs(OUT_DIR, exist_ok=True)
    write_safetensors(os.path.join(OUT_DIR, "gpt_twin_init.safetensors"), model.state_dict())
    data = batches()
    with torch.no_grad():
        forward_loss = model.window_loss(torch.tensor(data[0], dtype=torch.long)).item()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for batch in data:
        opt.zero_grad()
        loss = model.window_loss(torch.tensor(batch, dtype=torch.long))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    write_safetensors(os.path.join(OUT_DIR, "gpt_twin_final.safetensors"), model.state_dict())
    out = {
        "generator": "scripts/gpt_twin.py",
        "torch": torch.__version__,
        "config": CONFIG,
        "seed": SEED,
        "batch_size": BATCH,
        "adamw": dict(ADAMW, betas=list(ADAMW["betas"])),
        "init_weights": "gpt_twin_init.safetensors",
        "final_weights": "gpt_twin_final.safetensors",
        "num_params": sum(p.numel() for p in model.parameters()),
        "forward_loss": forward_loss,
        "losses": losses,
        "batches": data,
    }
    with open(os.path.join(OUT_DIR, "gpt_twin.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"forward loss {forward_loss:.6f}; step losses {losses[0]:.6f} .. {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
