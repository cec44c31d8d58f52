"""SubNetAct in torch and in ONNX, without Triton."""

import random

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from export import onnx_writer
from export.subnetact import BoolModule, WeightSlice, extract_subnet, insert_subnetact
from export.supernet import ResNetSupernet
from python_backend.control import ControlError
from python_backend.runners import SubnetTable, SupernetRunner
from tests.builders import TINY, calibrate_random, make_act, make_images


def test_insertion_rewrites_every_operator_and_keeps_the_weights():
    """Algorithm 1: blocks become BoolModules, convs WeightSlice, BNs SubnetNorm; parameters are reused."""
    plain = ResNetSupernet(TINY)
    params_before = {id(p) for p in plain.parameters()}
    act = insert_subnetact(plain)
    kinds = [type(m) for m in act.modules()]
    assert nn.Conv2d not in kinds and nn.BatchNorm2d not in kinds
    assert kinds.count(BoolModule) == sum(TINY.max_depths)
    assert [len(s.switches) for s in act.selects] == list(TINY.max_depths)
    assert {id(p) for p in act.parameters()} == params_before
    elastic = [m for m in act.modules() if isinstance(m, WeightSlice) and m.width is not None]
    assert len(elastic) == sum(TINY.max_depths)  # one middle-producing conv per block


def test_layer_select_and_weight_slice_follow_the_control_row():
    """D runs the first D_m blocks of a stage; W narrows each active block's middle channels."""
    act = make_act()
    act.set_subnet([1, 2, 0, 0, 1, 2, 0])
    assert [s.enabled for s in act.selects[0].switches] == [True, False]
    assert [s.enabled for s in act.selects[1].switches] == [True, True, False]
    assert [w.channels for w in act.widths] == [2, 2, 8, 16, 4]  # ceil(W * C); skipped blocks read W=0


def test_static_extraction_matches_the_supernet():
    """An extracted static subnet computes exactly what the actuated supernet computes."""
    act = make_act()
    rows = calibrate_random(act, 8)
    x = make_images(5)
    for i, row in enumerate(rows):
        act.set_subnet(row, i)
        with torch.no_grad():
            torch.testing.assert_close(extract_subnet(act)(x), act(x), rtol=1e-5, atol=1e-5)


def test_subnet_norm_uses_per_subnet_statistics():
    """Two subnets sharing every weight still normalise with their own statistics."""
    act = make_act()
    rows = calibrate_random(act, 3)
    norm = act.norms[-1]  # the stem's statistics are the same for every subnet; the last differ
    assert not torch.equal(norm.mean_table[0], norm.mean_table[1])
    act.set_subnet(rows[0], None)
    with pytest.raises(RuntimeError, match="no calibrated statistics"):
        act(make_images(1))


def test_calibration_records_each_norms_batch_mean_and_biased_variance():
    """SubnetNorm's statistics are the mean and biased variance of what each norm sees, per channel."""
    act = make_act()
    row = (2, 2, 1, 2, 2, 1, 0)
    seen = {}
    hooks = [n.register_forward_pre_hook(lambda m, args, j=j: seen.__setitem__(j, args[0].detach().clone()))
             for j, n in enumerate(act.norms)]
    stats = act.calibrate(row, make_images(32))
    for h in hooks:
        h.remove()
    assert seen and len(seen) < len(act.norms)  # the skipped block's norms did not run
    for j, x in seen.items():
        c = x.shape[1]
        np.testing.assert_allclose(stats.means[j][:c], x.mean(dim=(0, 2, 3)).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats.variances[j][:c], x.var(dim=(0, 2, 3), unbiased=False).numpy(),
                                   rtol=1e-4, atol=1e-6)


def test_supernet_onnx_has_control_flow_and_matches_torch(tmp_path):
    """The exported graph carries If/Slice/Gather and equals torch for every calibrated subnet."""
    act = make_act()
    rows = calibrate_random(act, 10)
    model = onnx_writer.supernet_model(act)
    ops = {n.op_type for n in model.graph.node}
    assert {"If", "Gather"} <= ops
    assert "Slice" in {n.op_type for g in _subgraphs(model.graph) for n in g.node}
    _assert_every_row_matches_torch(act, rows, _export(act, rows, tmp_path, model))


def test_folded_supernet_onnx_runs_each_subnet_as_torch_does(tmp_path):
    """The graph with one folded subnet per SUBNET value: If nodes only on SUBNET, no Slice or Gather left, and
    the same outputs as torch (and as the shared graph) for every calibrated subnet."""
    act = make_act()
    rows = calibrate_random(act, 7)
    model = onnx_writer.folded_supernet_model(act, rows)
    assert {i.name for i in model.graph.input} == {"INPUT", "SUBNET"}
    assert {n.op_type for n in model.graph.node} == {"If", "Less", "Identity"}  # three levels for 7 subnets
    assert not {"Slice", "Gather"} & {n.op_type for g in _subgraphs(model.graph) for n in g.node}
    _assert_every_row_matches_torch(act, rows, _export(act, rows, tmp_path, model))
    with pytest.raises(ValueError, match="7 calibrated"):
        onnx_writer.folded_supernet_model(act, rows[:3])


def test_a_weighted_choice_tree_reaches_every_leaf_and_the_heaviest_first():
    """Each value of the choice reaches its own leaf; a leaf weighing as much as the others together sits right
    under the root, where a balanced tree of eight leaves would put it three levels down."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = onnx_writer.Graph()
    choice = "CHOICE"

    def leaf(branch, i):
        return branch.op("Identity", [g.const(np.array([float(i)], np.float32), "leaf")])

    out = onnx_writer.choice_tree(g, g, choice, 8, leaf, weights=[7, 1, 1, 1, 1, 1, 1, 1])
    (root,) = [n for n in g.nodes if n.op_type == "If"]
    then_branch = next(a.g for a in root.attribute if a.name == "then_branch")
    assert [n.op_type for n in then_branch.node] == ["Identity"]
    graph = helper.make_graph(g.nodes, "tree", [helper.make_tensor_value_info(choice, TensorProto.INT64, [])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx_writer.OPSET)])
    model.ir_version = onnx_writer.IR_VERSION
    session = ort.InferenceSession(model.SerializeToString())
    assert [float(session.run(None, {choice: np.array(i)})[0][0]) for i in range(8)] == list(range(8))


def test_runner_groups_mixed_rows(tmp_path):
    """A batch whose rows name different subnets equals one run per row."""
    act = make_act()
    rows = calibrate_random(act, 5)
    runner = _export(act, rows, tmp_path)
    x = make_images(9).numpy()
    control = np.array([rows[random.Random(i).randrange(5)] for i in range(9)], dtype=np.int32)
    mixed = runner.infer(x, control)
    for i in range(9):
        np.testing.assert_allclose(mixed[i : i + 1], runner.infer(x[i : i + 1], control[i : i + 1]), rtol=1e-5, atol=1e-6)
    uncalibrated = next(r for r in _all_rows(act) if r not in rows)
    with pytest.raises(ControlError, match="CONTROL row 1: subnet .* has no SubnetNorm statistics"):
        runner.infer(x[:2], np.array([rows[0], uncalibrated], dtype=np.int32))


def test_static_onnx_matches_torch(tmp_path):
    """A statically exported subnet runs in onnxruntime with the torch subnet's outputs."""
    from python_backend.runners import StaticRunner

    act = make_act()
    rows = calibrate_random(act, 2)
    act.set_subnet(rows[1], 1)
    static = extract_subnet(act)
    onnx_writer.save(onnx_writer.static_model(static), tmp_path / "model.onnx")
    x = make_images(3)
    with torch.no_grad():
        np.testing.assert_allclose(StaticRunner(tmp_path).run(x.numpy()), static(x).numpy(), rtol=1e-4, atol=1e-5)


def _assert_every_row_matches_torch(act, rows, runner: SupernetRunner) -> None:
    x = make_images(4)
    for i, row in enumerate(rows):
        act.set_subnet(row, i)
        with torch.no_grad():
            expected = act(x).numpy()
        got = runner.infer(x.numpy(), np.tile(np.array(row, dtype=np.int32), (4, 1)))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def _export(act, rows, folder, model=None) -> SupernetRunner:
    """The supernet exported (``model`` if already written) with ``rows`` calibrated, and its runner."""
    onnx_writer.save(model or onnx_writer.supernet_model(act), folder / "model.onnx")
    (folder / "subnets.json").write_text(SubnetTable(act.layout, tuple(rows)).to_json())
    return SupernetRunner(folder)


def _subgraphs(graph: onnx.GraphProto):
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield attr.g
                yield from _subgraphs(attr.g)


def _all_rows(act):
    rng = random.Random(3)
    from export.train import random_subnet

    while True:
        yield random_subnet(act, rng)


def test_runner_maps_non_canonical_rows_to_their_subnet(tmp_path):
    """Widths of skipped blocks are ignored; a row seen once is still validated the same way later."""
    act = make_act()
    rows = calibrate_random(act, 4)
    runner = _export(act, rows, tmp_path)
    layout = act.layout
    shallow = layout.smallest()  # calibrate_random calibrates it; every stage skips blocks
    assert shallow in rows and any(d < m for d, m in zip(shallow, layout.max_depths))
    spelled = list(shallow)
    for stage, depth in enumerate(shallow[: layout.num_stages]):
        for block in range(depth, layout.max_depths[stage]):
            spelled[layout.num_stages + layout.block_index(stage, block)] = len(layout.width_choices) - 1
    x = make_images(2).numpy()
    for _ in range(2):  # the second call takes the cached path
        np.testing.assert_array_equal(runner.infer(x, np.array([spelled] * 2, dtype=np.int32)),
                                      runner.infer(x, np.array([shallow] * 2, dtype=np.int32)))
    bad = list(shallow)
    bad[layout.num_stages] = len(layout.width_choices)
    for _ in range(2):
        with pytest.raises(ControlError, match=r"W\[0\.0\]="):
            runner.infer(x[:1], np.array([bad], dtype=np.int32))


def test_uniform_subnets_climb_from_the_smallest_to_the_largest():
    from export.profiler import uniform_subnets

    layout = make_act().layout
    rows = uniform_subnets(layout)
    assert rows[0] == layout.smallest() and rows[-1] == layout.largest()
    assert len(set(rows)) == len(rows)
    for row in rows:  # every block that runs has the same width
        depths = row[: layout.num_stages]
        assert len({row[layout.num_stages + layout.block_index(s, b)]
                    for s, d in enumerate(depths) for b in range(d)}) == 1
    depths = sorted({row[: layout.num_stages] for row in rows})
    assert all(a <= b for lo, hi in zip(depths, depths[1:]) for a, b in zip(lo, hi))  # one ladder, no crossing


def test_calibration_images_are_distorted_like_training_batches():
    """SubnetNorm statistics come from the input distribution the supernet trained on."""
    from export import data

    clean = data.load(16)["train"].images[:64]
    first, again = data.calibration_images(16, 64), data.calibration_images(16, 64)
    assert torch.equal(first, again)  # one fixed draw: statistics are reproducible
    assert first.shape == clean.shape
    assert first.std() > torch.from_numpy(clean).std()  # pixel noise and warps, not the clean digits


def test_occlusion_paints_one_square_of_background_per_image():
    from export import data

    images = torch.rand(8, 1, 16, 16)  # no pixel is background (-1) yet
    out = data.occlude(images, 6, torch.Generator().manual_seed(0))
    hidden = out == -1.0
    assert hidden.sum(dim=(1, 2, 3)).tolist() == [36] * 8
    rows, cols = hidden[:, 0].any(dim=2), hidden[:, 0].any(dim=1)
    assert rows.sum(dim=1).tolist() == [6] * 8 and cols.sum(dim=1).tolist() == [6] * 8  # a square, not scattered
    assert torch.equal(out[~hidden], images[~hidden])  # the rest of each image is untouched


def test_latency_rounds_call_every_subnet_and_size_in_turn():
    """A slow spell must land on every subnet alike: each round calls everything once, in order."""
    from export.profiler import time_rounds

    order, finished = [], []
    calls = [lambda name=name: order.append(name) for name in "abc"]
    samples = time_rounds(calls, repeats=3, progress=finished.append)
    assert order == list("abc") * 4  # one untimed round, then three timed ones
    assert [len(s) for s in samples] == [3, 3, 3] and finished == [1, 2, 3]
