"""Train the digits supernet so that every subnet is accurate without retraining.

NOTE on the training rule. We follow the field's recipe in two phases:
1. *progressive shrinking, step one* (OFA): train the largest network alone;
2. reorder every block's middle channels by importance (L1 norm of the weights that read
   them, as OFA's ``re_organize_middle_weights``) so that WeightSlice's "first channels"
   are the important ones, then train the whole space with the *sandwich rule* (BigNAS):
   each step runs the largest subnet on the labels, then the smallest and
   ``num_random_subnets`` random ones, distilled in place from the largest one's soft
   predictions.
Every step sees freshly distorted images (:func:`export.data.distort`), the same kind of
distortion the held-out split is measured on.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from export import data
from export.presets import Preset, SupernetSpec
from export.subnetact import SubNetAct, build

log = logging.getLogger(__name__)


@torch.no_grad()
def reorganize_channels(act: SubNetAct) -> None:
    """Sort each block's middle channels by importance so WeightSlice keeps the best ones."""
    for switch in (s for select in act.selects for s in select.switches):
        block = switch.block
        importance = block.conv2.weight.abs().sum(dim=(0, 2, 3))
        order = torch.argsort(importance, descending=True)
        block.conv1.weight.copy_(block.conv1.weight[order])
        block.bn1.weight.copy_(block.bn1.weight[order])
        block.bn1.bias.copy_(block.bn1.bias[order])
        block.conv2.weight.copy_(block.conv2.weight[:, order])


def random_subnet(act: SubNetAct, rng: random.Random) -> tuple[int, ...]:
    layout = act.layout
    depths = [rng.randint(layout.min_depth, d) for d in layout.max_depths]
    widths = [rng.randrange(len(layout.width_choices)) for _ in range(layout.num_blocks)]
    return layout.validate(depths + widths)


def train(preset: Preset) -> SubNetAct:
    """Train a supernet with ``preset``; deterministic for a given preset and torch build."""
    torch.manual_seed(preset.seed)
    rng = random.Random(preset.seed)
    gen = torch.Generator().manual_seed(preset.seed)
    act = build(preset.spec)
    split = data.load(preset.spec.image_size)["train"]
    images, labels = torch.from_numpy(split.images), torch.from_numpy(split.labels)
    total_epochs = preset.full_epochs + preset.elastic_epochs
    steps_per_epoch = -(-len(images) // preset.batch_size)
    opt = torch.optim.SGD(act.parameters(), lr=preset.lr, momentum=0.9, nesterov=True,
                          weight_decay=preset.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=preset.lr, total_steps=total_epochs * steps_per_epoch)
    act.train()
    started = time.monotonic()
    for epoch in range(total_epochs):
        elastic = epoch >= preset.full_epochs
        if epoch == preset.full_epochs:
            reorganize_channels(act)
            opt.state.clear()  # momentum buffers belong to the old channel order
        perm = torch.randperm(len(images), generator=gen)
        total_loss = 0.0
        for step in range(steps_per_epoch):
            idx = perm[step * preset.batch_size : (step + 1) * preset.batch_size]
            x, y = data.distort(images[idx], gen), labels[idx]
            opt.zero_grad()
            act.set_subnet(act.layout.largest())
            logits = act(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            if elastic:
                soft = F.softmax(logits.detach(), dim=1)
                rows = [act.layout.smallest()] + [random_subnet(act, rng) for _ in range(preset.num_random_subnets)]
                for row in rows:
                    act.set_subnet(row)
                    student = F.log_softmax(act(x), dim=1)
                    F.kl_div(student, soft, reduction="batchmean").backward()
            opt.step()
            sched.step()
            total_loss += loss.item()
        log.info("epoch %d/%d (%s): loss %.3f, %.0fs", epoch + 1, total_epochs,
                 "sandwich" if elastic else "largest", total_loss / steps_per_epoch, time.monotonic() - started)
    act.eval()
    return act


def save(act: SubNetAct, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in act.state_dict().items() if not k.endswith(("mean_table", "var_table"))}
    tmp = path.with_suffix(".tmp")
    torch.save({"spec": act.spec.to_dict(), "state": state}, tmp)
    tmp.replace(path)


def load(path: Path) -> SubNetAct:
    raw = torch.load(path, map_location="cpu", weights_only=True)
    act = build(SupernetSpec.from_dict(raw["spec"]))
    missing, unexpected = act.load_state_dict(raw["state"], strict=False)
    if unexpected or any(not k.endswith(("mean_table", "var_table")) for k in missing):
        raise ValueError(f"{path}: checkpoint does not match the supernet ({missing[:3]}, {unexpected[:3]})")
    return act.eval()
