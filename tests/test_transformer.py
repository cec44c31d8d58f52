"""The transformer supernet: tokenizer, graphs against torch, and the whole family served live (fast preset)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from export import text_data, transformer, transformer_onnx
from export.text_artifacts import TEXT_MODEL, TextArtifacts, all_rows
from python_backend.tokenizer import PAD, UNK, VOCAB_FILE, Tokenizer
from tests.conftest import REPO_ROOT

TINY = transformer.TransformerSpec(vocab_size=50, seq_len=12, d_model=16, heads=4, ffn=32, layers=3)


def test_the_tokenizer_pads_cuts_and_marks_unknown_words(tmp_path):
    tok = Tokenizer.from_corpus(["A fine film.", "a FINE, fine film", "dull"], size=5, min_count=2)
    assert tok.tokens == (PAD, UNK, "fine", "a", "film")  # most frequent first; "dull" and "." seen once
    ids = tok.encode(["Fine film, dull", "a a a a a a"], length=4)
    assert ids.tolist() == [[2, 4, 1, 1], [3, 3, 3, 3]]  # "," and "dull" unknown; the second row cut at 4
    assert tok.encode([""], length=3).tolist() == [[0, 0, 0]]
    tok.save(tmp_path / VOCAB_FILE)
    assert Tokenizer.load(tmp_path / VOCAB_FILE) == tok
    with pytest.raises(ValueError, match="starts with"):
        Tokenizer(("fine", PAD, UNK))


def test_the_task_composes_the_shipped_snippets_words_and_labels_by_its_rule():
    assert len(text_data.snippets().texts) == 12_752  # distinct snippets with one label
    lex = text_data.lexicon()
    assert {"dull", "tiresome"} <= set(lex.polar[0]) and {"riveting", "wonderful"} <= set(lex.polar[1])
    assert not set(lex.neutral) & {*lex.polar[0], *lex.polar[1]}
    assert text_data.label("the film not dull", lex) == 1  # a negated rotten word
    assert text_data.label("hardly riveting and never wonderful but wonderful", lex) == 1  # after "but" decides
    assert text_data.label("riveting and not wonderful and dull", lex) == 0  # the majority of three
    assert text_data.label("not never riveting", lex) == 1  # two negations cancel
    split = text_data.load()
    assert 0.45 < split["heldout"].labels.mean() < 0.55
    assert split["heldout"].texts != split["train"].texts[: len(split["heldout"].texts)]


def test_every_subnet_of_the_graphs_matches_torch():
    """The supernet graph (control inputs) equals the torch module on every subnet of a tiny untrained encoder, and
    so does the static graph of every third, with padding (a row that is all padding included)."""
    import onnx
    import onnxruntime as ort

    torch.manual_seed(0)
    model = transformer.ElasticEncoder(TINY).eval()
    x = np.random.default_rng(0).integers(1, TINY.vocab_size, (5, TINY.seq_len))
    x[1, 7:] = 0
    x[2] = 0
    supernet = ort.InferenceSession(transformer_onnx.supernet_model(model).SerializeToString())
    rows = all_rows(model)
    assert len(rows) == 4 + 16 + 64
    for i, row in enumerate(rows):
        model.set_subnet(row)
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        got = supernet.run(["LOGITS"], {"INPUT": x, "DEPTH": np.array(row[:1]), "WIDTH": np.array(row[1:])})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        if i % 3:
            continue  # a static graph is a session of its own: every third subnet's, every depth among them
        static_graph = transformer_onnx.static_model(model, row)
        weights = [t for t in static_graph.graph.initializer
                   if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) > 1]  # not the scalars
        assert sum(len(t.raw_data) for t in weights) == TINY.weight_bytes(row)
        static = ort.InferenceSession(static_graph.SerializeToString())
        np.testing.assert_allclose(static.run(["LOGITS"], {"INPUT": x})[0], expected, rtol=1e-4, atol=1e-5)


def test_width_keeps_the_first_heads_and_units_and_depth_the_first_layers():
    assert TINY.widths((2, 0, 3, 1)) == [(1, 8), (4, 32)]
    assert TINY.macs((1, 0, 0, 0)) < TINY.macs((1, 3, 0, 0)) < TINY.macs((2, 3, 3, 0))


def test_rewiring_reorders_heads_and_units_without_changing_the_function():
    torch.manual_seed(1)
    model = transformer.ElasticEncoder(TINY).eval()
    x = torch.randint(1, TINY.vocab_size, (3, TINY.seq_len))
    before = model(x)
    transformer.rewire(model)
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)
    layer = model.layers[0]
    dh = layer.head_dim
    head_norms = layer.out.weight.abs().view(-1, TINY.heads, dh).sum(dim=(0, 2))
    assert (head_norms[:-1] >= head_norms[1:]).all()
    unit_norms = layer.ffn2.weight.abs().sum(0)
    assert (unit_norms[:-1] >= unit_norms[1:]).all()


@pytest.mark.triton
@pytest.mark.slow
def test_the_transformer_demo_serves_every_pareto_subnet_as_torch_computes_it(tmp_path, capsys):
    """`accscale demo --family transformer`, cut down: the fast preset trained, profiled through Triton, served by
    SlackFit behind the sidecar; then every Pareto subnet through Triton, on text a client tokenized with the
    vocabulary shipped beside the model, equals torch."""
    import tritonclient.grpc as grpcclient

    from loadtest.requestlog import RequestLog
    from loadtest.traces import Trace
    from scheduler_sidecar.cli import main
    from scheduler_sidecar.core.profile import Profile
    from scheduler_sidecar.processes.triton_launcher import TritonServer

    out, repository = tmp_path / "demo", tmp_path / "repository"
    # the SLO and the trace are the test's: the suite loads the machine, and what is tested here is serving, not the
    # SLO's regime (a trace sized from the fast build's profile would ask thousands of requests a second)
    assert main(["demo", "--family", "transformer", "--preset", "fast", "--build-dir", str(REPO_ROOT / "build"),
                 "--repository", str(repository), "--duration-s", "1", "--slo-ms", "40", "--base-qps", "50",
                 "--variant-qps", "100", "--out", str(out)]) == 0
    assert f"report: {out / 'report' / 'report.html'}" in capsys.readouterr().out
    artifacts = TextArtifacts(transformer.get_preset("fast"), REPO_ROOT / "build")
    model, profile = artifacts.encoder(), Profile.load(artifacts.profile_path)
    assert len(profile.variants) >= 2
    summary = (out / "report" / "summary.md").read_text()
    for policy in ("slackfit", "clipper", "infaas"):
        assert f"| {policy} |" in summary
        log = RequestLog.load(out / policy / "requests.csv")
        assert log.summary()["queries"] == len(Trace.load(out / "trace.txt"))
        # every request answered by a Pareto subnet, or refused explicitly by the sidecar when its SLO could not be met
        # (late, or refused at the door by admission)
        assert {e.status for e in log.entries} <= {"ok", "StatusCode.DEADLINE_EXCEEDED",
                                                   "StatusCode.RESOURCE_EXHAUSTED"}
        served = {e.variant for e in log.entries if e.status == "ok"}
        assert served and served <= {v.id for v in profile.variants}
    vocabulary = Tokenizer.load(repository / TEXT_MODEL / "1" / VOCAB_FILE)
    texts = list(itertools.islice(text_data.load()["heldout"].texts, 4)) + ["", "zzz unheard-of words"]
    tokens = vocabulary.encode(texts, model.spec.seq_len)
    with TritonServer(repository=repository, models=[TEXT_MODEL]) as server, \
            grpcclient.InferenceServerClient(server.grpc_url) as client:
        for variant in profile.variants:
            control = np.tile(np.asarray(variant.actuation.control, dtype=np.int32), (len(tokens), 1))
            inputs = [grpcclient.InferInput("INPUT", list(tokens.shape), "INT64"),
                      grpcclient.InferInput("CONTROL", list(control.shape), "INT32")]
            inputs[0].set_data_from_numpy(tokens)
            inputs[1].set_data_from_numpy(control)
            got = client.infer(TEXT_MODEL, inputs).as_numpy("LOGITS")
            model.set_subnet(variant.actuation.control)
            with torch.no_grad():
                expected = model(torch.from_numpy(tokens)).numpy()
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
