"""Model families for a multi-application deployment (Proteus' query types), trained here and written as Triton models.

Three query types, each a family of three variants of rising accuracy and cost:

- ``digits``: three static subnets of the fast preset's supernet (distorted digits, 16x16), from the
  least to the most accurate of its Pareto front;
- ``wine`` and ``cancer``: multilayer perceptrons on two more datasets that scikit-learn ships (wine: 13
  features, 3 classes; breast cancer: 30 features, 2 classes), each split once in half, stratified,
  trained on one half and scored on the other. Every model of the family could separate these classes
  alike from all the features, so the cheaper variants also see fewer of them (the ones with the highest
  ANOVA F on the training half; the rest get zero weight): 2 features and 64 hidden units, 6 and two
  layers of 256, all of them and three layers of 1024.

Every variant is its own Triton model (the ``static`` runner), profiled with onnxruntime at batch
sizes 1, 2, 4 and 8; a family's profile gives each device kind of ``kinds`` the measured curves times
its slowdown (an emulated slower kind, :mod:`python_backend.emulation`). Built once into ``folder``;
``families.json`` there records what it was built from, and a changed recipe rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export import repository
from export.artifacts import Artifacts
from export.cache import exclusive
from export.presets import get_preset
from export.profiler import export_static, percentile, time_rounds
from python_backend.emulation import write_latency
from python_backend.runners import MODEL_FILE, make_session
from scheduler_sidecar.core.profile import Actuation, LatencyCurve, Profile, Variant, pareto_front

log = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8)
REPEATS = 30
# (features seen, hidden layers) of the three variants; None: every feature. Cost grows ~1000x from first to last
MLP_VARIANTS = ((2, (64,)), (6, (256, 256)), (None, (1024, 1024, 1024)))
EPOCHS = 300
SPLIT_SEED = 0
RECIPE = {"batch_sizes": BATCH_SIZES, "mlps": MLP_VARIANTS, "epochs": EPOCHS, "seed": SPLIT_SEED, "version": 2}


def tabular(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of a scikit-learn dataset, split once in half, stratified."""
    from sklearn.datasets import load_breast_cancer, load_wine  # lazy: sklearn
    from sklearn.model_selection import train_test_split  # lazy: sklearn

    loaders = {"wine": load_wine, "cancer": load_breast_cancer}
    x, y = loaders[name](return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x.astype(np.float32), y, test_size=0.5, stratify=y,
                                                        random_state=SPLIT_SEED)
    return x_train, y_train, x_test, y_test


def train_mlp(x: np.ndarray, y: np.ndarray, hidden: Sequence[int], seed: int = SPLIT_SEED) -> list[tuple]:
    """A ReLU MLP trained full-batch with Adam; its layers as (weight [out, in], bias), standardisation folded
    into the first one."""
    import torch  # lazy: torch

    torch.manual_seed(seed)
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-6
    sizes = [x.shape[1], *hidden, int(y.max()) + 1]
    layers = [torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]
    net = torch.nn.Sequential(*[m for layer in layers[:-1] for m in (layer, torch.nn.ReLU())], layers[-1])
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    xt, yt = torch.from_numpy((x - mean) / std), torch.from_numpy(y).long()
    for _ in range(EPOCHS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    weights = [(layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy()) for layer in layers]
    w0, b0 = weights[0]
    weights[0] = ((w0 / std).astype(np.float32), (b0 - (w0 / std) @ mean).astype(np.float32))
    return weights


def mlp_onnx(weights: list[tuple], name: str) -> onnx.ModelProto:
    """INPUT [N, F] -> Gemm/Relu ... -> LOGITS [N, C]."""
    nodes, inits, x = [], [], "INPUT"
    for i, (w, b) in enumerate(weights):
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(b.astype(np.float32), f"b{i}")]
        out = "LOGITS" if i == len(weights) - 1 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [out if i == len(weights) - 1 else f"z{i}"],
                                      transB=1))
        if i < len(weights) - 1:
            nodes.append(helper.make_node("Relu", [f"z{i}"], [out]))
        x = out
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT,
                                                                          ["N", weights[0][0].shape[1]])],
                              [helper.make_tensor_value_info("LOGITS", TensorProto.FLOAT, ["N", weights[-1][0].shape[0]])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what the onnxruntime in Triton's python backend reads
    onnx.checker.check_model(model)
    return model


def profile_model(model_dir: Path, input_shape: Sequence[int]) -> LatencyCurve:
    """p50 and p99 of a written model at BATCH_SIZES, one onnxruntime thread, REPEATS rounds; the p50s also go
    beside it for an emulated device's padding (:mod:`python_backend.emulation`)."""
    session = make_session(model_dir / "1" / MODEL_FILE, threads=1)
    calls = [lambda b=b: session.run(["LOGITS"], {"INPUT": np.zeros((b, *input_shape), np.float32)})
             for b in BATCH_SIZES]
    samples = time_rounds(calls, REPEATS)
    curve = LatencyCurve(BATCH_SIZES, tuple(percentile(s, 50) for s in samples),
                         tuple(percentile(s, 99) for s in samples))
    write_latency(model_dir / "1", list(curve.batch_sizes), list(curve.p50_ms))
    return curve


def _variants(members: list[tuple[str, str, float, LatencyCurve]], kinds: Mapping[str, float]) -> tuple[Variant, ...]:
    return tuple(Variant(vid, accuracy, Actuation("model", model), {k: curve.scaled(f) for k, f in kinds.items()})
                 for vid, model, accuracy, curve in members)


def _digits(repo: Path, build_dir: Path) -> list[tuple[str, str, float, LatencyCurve]]:
    artifacts = Artifacts(get_preset("fast"), build_dir)
    act = artifacts.supernet()
    candidates = list(artifacts.calibration(act).candidates)
    front = [candidates[i] for i in pareto_front([(c.macs, c.accuracy) for c in candidates])]
    picked = [front[0], front[len(front) // 2], front[-1]]
    members = []
    for c in picked:
        model_dir = export_static(act, c, repo, supernet_name="digits")
        image = act.spec.image_size
        members.append((f"digits-{c.subnet_id}", model_dir.name, c.accuracy,
                        profile_model(model_dir, (1, image, image))))
    return members


def _mlps(name: str, repo: Path) -> list[tuple[str, str, float, LatencyCurve]]:
    from sklearn.feature_selection import f_classif  # lazy: sklearn

    x_train, y_train, x_test, y_test = tabular(name)
    features = x_train.shape[1]
    ranked = np.argsort(-f_classif(x_train, y_train)[0])
    members = []
    for seen, hidden in MLP_VARIANTS:
        cols = np.sort(ranked[:seen or features])
        weights = train_mlp(x_train[:, cols], y_train, hidden)
        first = np.zeros((weights[0][0].shape[0], features), np.float32)  # every variant takes all the features
        first[:, cols] = weights[0][0]
        weights[0] = (first, weights[0][1])
        label = f"{len(cols)}f-{'x'.join(map(str, hidden))}"
        model_name = f"{name}_mlp_{label.replace('-', '_')}"
        model_dir = repository.write_model(repo, model_name, mlp_onnx(weights, model_name), [features],
                                           weights[-1][0].shape[0], {"runner": "static", "intra_op_threads": "1"})
        session = make_session(model_dir / "1" / MODEL_FILE, threads=1)
        accuracy = float((session.run(["LOGITS"], {"INPUT": x_test})[0].argmax(axis=1) == y_test).mean())
        members.append((f"{name}-{label}", model_name, accuracy, profile_model(model_dir, (features,))))
    return members


def build(folder: Path, kinds: Mapping[str, float], build_dir: Path) -> dict[str, Path]:
    """Query type -> its profile's path, building the families into ``folder/repository`` unless up to date."""
    stamp = folder / "families.json"
    key = hashlib.sha256(json.dumps({**RECIPE, "kinds": dict(kinds)}, sort_keys=True).encode()).hexdigest()
    paths = {q: folder / f"{q}.json" for q in ("digits", "wine", "cancer")}
    with exclusive(folder):
        if not (stamp.exists() and json.loads(stamp.read_text()).get("key") == key
                and all(p.exists() for p in paths.values())):
            _build(folder, kinds, build_dir, paths)
            stamp.write_text(json.dumps({"key": key, "recipe": RECIPE, "kinds": dict(kinds)}))
    return paths


def _build(folder: Path, kinds: Mapping[str, float], build_dir: Path, paths: dict[str, Path]) -> None:
    repo = folder / "repository"
    log.info("building the digits, wine and cancer families into %s", folder)
    families = {"digits": _digits(repo, build_dir), "wine": _mlps("wine", repo), "cancer": _mlps("cancer", repo)}
    for q, members in families.items():
        members.sort(key=lambda m: m[2])
        Profile(f"family-{q}", "export/families.py (onnxruntime, 1 thread, this machine)",
                _variants(members, kinds)).save(paths[q])
