"""A BERT-like encoder with elastic depth and width, and its training: the transformer family of SubNetAct.

The network is the largest subnet: token and position embeddings, ``layers`` pre-norm encoder layers (multi-head
self-attention, then a GELU feed-forward network), a final LayerNorm, a mean over the non-padding tokens and a
linear head. A control row of :class:`~python_backend.control.ControlLayout` (one stage of ``layers`` blocks)
actuates a subnet in place, as for the CNN: ``D`` runs the first D layers (LayerSelect) and ``W_l`` keeps the first
ceil(W * heads) attention heads and ceil(W * ffn) feed-forward units of layer l (WeightSlice), DynaBERT's two width
dimensions moved together.

# Decision (DynaBERT's depth rule): DynaBERT drops layers evenly (every other one at half depth); we run the first
# D, SubNetAct's LayerSelect, so that one control layout and one graph writer serve both families.
# Decision (SubnetNorm): LayerNorm normalises each token by its own statistics, so a transformer subnet has no
# batch statistics to calibrate; "calibrating" a subnet here is measuring its held-out accuracy.
# Decision (pre-norm): BERT normalises after each residual sum; a pre-norm encoder trains from scratch at this size
# without warm-up tricks and keeps every prefix of its layers a usable network, which elastic depth needs.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from export import text_data
from python_backend.control import ControlLayout, channels
from scheduler_sidecar.errors import ConfigError

log = logging.getLogger(__name__)

MASK_BIAS = -1e9  # added to attention scores of padding keys (the ONNX graph adds the same)


@dataclass(frozen=True)
class TransformerSpec:
    vocab_size: int = 1024  # the composed sentences use 547 words
    seq_len: int = 40  # tokens per input row; a composed sentence has at most 34
    d_model: int = 64
    heads: int = 4
    ffn: int = 256
    layers: int = 4
    num_classes: int = 2
    width_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)

    @property
    def layout(self) -> ControlLayout:
        return ControlLayout((self.layers,), self.width_choices)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def widths(self, row: Sequence[int]) -> list[tuple[int, int]]:
        """(heads, feed-forward units) of every layer that ``row`` runs."""
        depth = row[0]
        return [(channels(self.width_choices[w], self.heads), channels(self.width_choices[w], self.ffn))
                for w in row[1 : 1 + depth]]

    def macs(self, row: Sequence[int]) -> int:
        """Multiply-accumulates for one full-length input row (embeddings are lookups)."""
        t, d = self.seq_len, self.d_model
        total = d * self.num_classes
        for heads, ffn in self.widths(row):
            inner = heads * self.head_dim
            total += t * (4 * d * inner + 2 * d * ffn) + 2 * t * t * inner
        return total


    def weight_bytes(self, row: Sequence[int]) -> int:
        """float32 bytes of subnet ``row`` exported alone (its static graph's initialisers)."""
        d = self.d_model
        total = (self.vocab_size + self.seq_len + 2) * d + (d + 1) * self.num_classes
        for heads, ffn in self.widths(row):
            inner = heads * self.head_dim
            total += 4 * d + 3 * (d + 1) * inner + (inner + 1) * d + (d + 1) * ffn + (ffn + 1) * d
        return 4 * total


class EncoderLayer(nn.Module):
    def __init__(self, spec: TransformerSpec, dropout: float) -> None:
        super().__init__()
        d = spec.d_model
        self.head_dim = spec.head_dim
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.query, self.key, self.value, self.out = (nn.Linear(d, d) for _ in range(4))
        self.ffn1, self.ffn2 = nn.Linear(d, spec.ffn), nn.Linear(spec.ffn, d)
        self.dropout = nn.Dropout(dropout)
        self.heads, self.units = spec.heads, spec.ffn  # the active width (WeightSlice)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        inner = self.heads * self.head_dim

        def project(linear: nn.Linear, h: torch.Tensor) -> torch.Tensor:  # [N, heads, T, head_dim]
            y = F.linear(h, linear.weight[:inner], linear.bias[:inner])
            return y.view(n, t, self.heads, self.head_dim).transpose(1, 2)

        h = self.norm1(x)
        q, k, v = project(self.query, h), project(self.key, h), project(self.value, h)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask_bias
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, inner)
        x = x + self.dropout(F.linear(context, self.out.weight[:, :inner], self.out.bias))
        h = F.gelu(F.linear(self.norm2(x), self.ffn1.weight[: self.units], self.ffn1.bias[: self.units]))
        return x + self.dropout(F.linear(h, self.ffn2.weight[:, : self.units], self.ffn2.bias))


class ElasticEncoder(nn.Module):
    """``set_subnet(row)`` then ``forward(tokens)``: logits of that subnet."""

    def __init__(self, spec: TransformerSpec, dropout: float = 0.1) -> None:
        super().__init__()
        self.spec = spec
        self.layout = spec.layout
        self.embed = nn.Embedding(spec.vocab_size, spec.d_model)
        self.position = nn.Parameter(torch.zeros(spec.seq_len, spec.d_model))
        self.layers = nn.ModuleList(EncoderLayer(spec, dropout) for _ in range(spec.layers))
        self.norm = nn.LayerNorm(spec.d_model)
        self.head = nn.Linear(spec.d_model, spec.num_classes)
        self.dropout = nn.Dropout(dropout)
        nn.init.normal_(self.embed.weight, std=0.02)  # as BERT: tokens and positions on one scale
        nn.init.normal_(self.position, std=0.02)
        self.depth = spec.layers
        self.row = self.layout.largest()

    def set_subnet(self, row: Sequence[int]) -> tuple[int, ...]:
        row = self.layout.validate(row)
        self.depth = row[0]
        for layer, (heads, units) in zip(self.layers, self.spec.widths(row)):
            layer.heads, layer.units = heads, units
        self.row = row
        return row

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        keep = (tokens != 0).to(torch.float32)  # [N, T]
        mask_bias = ((1.0 - keep) * MASK_BIAS)[:, None, None, :]
        x = self.dropout(self.embed(tokens) + self.position)
        for layer in self.layers[: self.depth]:
            x = layer(x, mask_bias)
        x = self.norm(x)
        pooled = (x * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1.0)
        return self.head(pooled)


@dataclass(frozen=True)
class TransformerPreset:
    name: str
    spec: TransformerSpec
    full_epochs: int  # phase 1: the largest network alone
    elastic_epochs: int  # phase 2: sandwich rule with in-place distillation
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    num_random_subnets: int = 1
    seed: int = 0

    def fingerprint(self) -> str:
        return repr((asdict(self), text_data.FINGERPRINT))


TRANSFORMER_PRESETS: dict[str, TransformerPreset] = {
    # tests: seconds of training
    "fast": TransformerPreset("fast", TransformerSpec(d_model=32, ffn=64, layers=2), full_epochs=1, elastic_epochs=1),
    # the transformer demo's: about 5 minutes of training here; the deeper and wider subnets keep gaining on the
    # shallow narrow ones over the last elastic epochs (96.1% against 98.9% after 12 in all)
    "full": TransformerPreset("full", TransformerSpec(), full_epochs=3, elastic_epochs=9),
}


def get_preset(name: str) -> TransformerPreset:
    if name not in TRANSFORMER_PRESETS:
        raise ConfigError(f"unknown transformer preset {name!r}; choose one of {sorted(TRANSFORMER_PRESETS)}")
    return TRANSFORMER_PRESETS[name]


@torch.no_grad()
def rewire(model: ElasticEncoder) -> None:
    """DynaBERT's network rewiring: order each layer's heads and feed-forward units by importance (the L1 norm of
    the output weights that read them), so that WeightSlice's first heads and units are the most important."""
    for layer in model.layers:
        dh = layer.head_dim
        heads = layer.out.weight.abs().view(-1, layer.out.weight.shape[1] // dh, dh).sum(dim=(0, 2))
        rows = torch.cat([torch.arange(h * dh, (h + 1) * dh) for h in torch.argsort(heads, descending=True)])
        for linear in (layer.query, layer.key, layer.value):
            linear.weight.copy_(linear.weight[rows])
            linear.bias.copy_(linear.bias[rows])
        layer.out.weight.copy_(layer.out.weight[:, rows])
        units = torch.argsort(layer.ffn2.weight.abs().sum(0), descending=True)
        layer.ffn1.weight.copy_(layer.ffn1.weight[units])
        layer.ffn1.bias.copy_(layer.ffn1.bias[units])
        layer.ffn2.weight.copy_(layer.ffn2.weight[:, units])


def random_row(layout: ControlLayout, rng: random.Random) -> tuple[int, ...]:
    depths = [rng.randint(layout.min_depth, d) for d in layout.max_depths]
    return layout.validate(depths + [rng.randrange(len(layout.width_choices)) for _ in range(layout.num_blocks)])


def train(preset: TransformerPreset, tokens: np.ndarray, labels: np.ndarray) -> ElasticEncoder:
    """Phase 1 trains the largest network alone; after rewiring, phase 2 runs each step's largest subnet on the
    labels and the smallest and ``num_random_subnets`` random ones on its soft predictions (BigNAS's sandwich rule;
    DynaBERT distils width and depth from the full network the same way)."""
    torch.manual_seed(preset.seed)
    rng = random.Random(preset.seed)
    gen = torch.Generator().manual_seed(preset.seed)
    model = ElasticEncoder(preset.spec)
    x_all, y_all = torch.from_numpy(tokens), torch.from_numpy(labels)
    layout = model.layout
    steps = -(-len(x_all) // preset.batch_size)
    total = preset.full_epochs + preset.elastic_epochs
    opt = torch.optim.AdamW(model.parameters(), lr=preset.lr, weight_decay=preset.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=preset.lr, total_steps=total * steps, pct_start=0.1)
    model.train()
    started = time.monotonic()
    for epoch in range(total):
        elastic = epoch >= preset.full_epochs
        if epoch == preset.full_epochs:
            rewire(model)
            opt.state.clear()  # Adam's moments belong to the old order
        perm = torch.randperm(len(x_all), generator=gen)
        for step in range(steps):
            idx = perm[step * preset.batch_size : (step + 1) * preset.batch_size]
            x, y = x_all[idx], y_all[idx]
            opt.zero_grad()
            model.set_subnet(layout.largest())
            logits = model(x)
            F.cross_entropy(logits, y).backward()
            if elastic:
                soft = logits.detach().softmax(-1)
                rows = [layout.smallest()] + [random_row(layout, rng) for _ in range(preset.num_random_subnets)]
                for row in rows:
                    model.set_subnet(row)
                    F.cross_entropy(model(x), soft).backward()
            opt.step()
            sched.step()
        log.info("transformer epoch %d/%d (%s, %.0fs)", epoch + 1, total, "elastic" if elastic else "full",
                 time.monotonic() - started)
    model.set_subnet(layout.largest())
    return model.eval()


@torch.no_grad()
def accuracy(model: ElasticEncoder, row: Sequence[int], tokens: np.ndarray, labels: np.ndarray,
             chunk: int = 512) -> float:
    model.eval()
    model.set_subnet(row)
    x = torch.from_numpy(tokens)
    predicted = torch.cat([model(x[i : i + chunk]).argmax(1) for i in range(0, len(x), chunk)]).numpy()
    return float((predicted == labels).mean())
