"""The feature-level proposer ``eagle``: exact for every speculative method (greedy identity here, the first two
tokens' distribution by chi-square, every distribution over long outputs in ``test_audit.py``), its head's cache
bookkeeping equal to a recompute from scratch, refused in one line where it cannot run, and a published EAGLE
checkpoint's layout loaded as the same head."""

from __future__ import annotations

import copy
import importlib
import json

import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.proposers.feature import FEATURE_HEAD, FeatureProposer, attach
from pipeline.decoding.runner import HFRunner
from pipeline.decoding.sampling import Sampling
from pipeline.errors import ArgumentError
from pipeline.measure.acceptance import decoding_metrics
from pipeline.models import ModelError
from pipeline.models.feature_head import FeatureHead
from pipeline.models.head_files import load_head, save_head
from pipeline.models.head_training import target_features

from .conftest import perturbed, tiny_llama
from .test_sampling_lossless import SETTINGS, TWO, check_case, make_models

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1]


def with_head(model, kept=None, seed=0):
    """A copy of ``model`` with a random feature head attached (it proposes, sometimes rightly)."""
    model = copy.deepcopy(model)
    torch.manual_seed(seed)
    head = FeatureHead(model, kept)
    with torch.no_grad():
        head.fc.weight.mul_(4)  # a peaked head: its proposals differ from token to token
    attach(model, head)
    return model


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(40, vocab=64, hidden=32, layers=2)
    return [with_head(target), perturbed(target, 0.2, seed=41)]


SPECULATIVE = [
    ("sd", {}, 3),
    ("we_sd", {"lambda": 0.5}, 3),
    ("we_se", {"lambda": 0.5}, [2, 3]),
    ("cd_sd", {"alpha": 0.3}, 2),
    ("cd_se", {"alpha": 0.3}, [2, 1]),
    ("gac_sd", {"lambda": 0.5, "threshold": 0.4}, 3),
    ("gac_se", {"lambda": 0.5, "threshold": 0.4}, [1, 2]),
]


@pytest.mark.spread("proposer")  # make test: each method with the head alone or chained, in turn (tests/tiers.py)
@pytest.mark.parametrize("proposer", ["eagle", "eagle+draft"])
@pytest.mark.parametrize("method,args,gamma", SPECULATIVE, ids=[m for m, _, _ in SPECULATIVE])
def test_greedy_outputs_equal_the_standard_method(pair, method, args, gamma, proposer):
    standard = {"sd": "large_model"}.get(method, method.rsplit("_", 1)[0])
    base = generate(pair, PROMPT, standard, max_new_tokens=40, method_args=args).token_ids
    out = generate(pair, PROMPT, method, gamma, 40, method_args={**args, "proposer": proposer})
    assert out.token_ids == base
    assert out.stats.proposers["eagle"].proposed > 0  # it drafted, and was counted
    assert not pair[0].model.norm._forward_pre_hooks  # it stopped reading the target's features


def test_a_head_with_a_restricted_vocabulary_proposes_only_its_ids(pair):
    kept = [0, 3, 5, 7, 11, 13, 17, 19]
    models = [with_head(pair[0], kept), pair[1]]
    head = models[0].__dict__[FEATURE_HEAD]
    row = head.logits(torch.randn(32, dtype=torch.float64))
    assert torch.isfinite(row).nonzero()[:, 0].tolist() == kept  # probability exactly 0 elsewhere
    base = generate(models, PROMPT, "large_model", max_new_tokens=30).token_ids
    assert generate(models, PROMPT, "sd", 2, 30, method_args={"proposer": "eagle"}).token_ids == base
    out = generate(models, PROMPT, "sd", 2, 30, method_args={"proposer": "eagle"}, temperature=1.0, seed=3)
    assert out.stats.proposers["eagle"].proposed > 0 and len(out.token_ids) == 30


EAGLE_CASES = [
    ("sd", [0], "single", {}, {"gamma": 2, "method_args": {"proposer": "eagle"}}),
    ("we_sd", [0, 1], "we", {"weights": [0.5, 0.5]}, {"method_args": {**TWO["we"], "proposer": "eagle"}, "gamma": 2}),
    (
        "we_se",
        [0, 1],
        "we",
        {"weights": [0.5, 0.5]},
        {"method_args": {**TWO["we"], "proposer": "eagle+draft"}, "gamma": [1, 2]},
    ),
    ("cd_sd", [0, 1], "cd", {"alpha": 0.3}, {"method_args": {**TWO["cd"], "proposer": "eagle"}, "gamma": 2}),
    # token trees drafted from the head's distribution: children drawn without replacement, static and dynamic
    ("sd", [0], "single", {}, {"gamma": 2, "method_args": {"proposer": "eagle"}, "tree": "3x2w"}),
    (
        "we_sd",
        [0, 1],
        "we",
        {"weights": [0.5, 0.5]},
        {"method_args": {**TWO["we"], "proposer": "eagle+draft"}, "gamma": 2, "tree": "d4"},
    ),
]


def case_id(case) -> str:
    return "-".join([case[0], case[4]["method_args"]["proposer"], case[4].get("tree", "chain")])


@pytest.fixture(scope="module")
def sampling_models():
    models = make_models()
    return [with_head(models[0], kept=[0, 1, 2, 4, 5], seed=7), *models[1:]]


QUICK_EAGLE = {"sd-eagle-chain", "sd-eagle-3x2w", "we_se-eagle+draft-chain"}  # make test: each proposer, a tree


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=case_id(c), marks=() if case_id(c) in QUICK_EAGLE else pytest.mark.exhaustive)
        for c in EAGLE_CASES
    ],
)
def test_first_two_tokens_follow_the_target(sampling_models, case):
    check_case(sampling_models, case, SETTINGS[0] if case[0] != "we_sd" else SETTINGS[1])


def reference(head, features, tokens, true):
    """The head's predicted feature after inputs 0..len(tokens)-2, from scratch: true features below ``true``."""
    last = len(tokens) - 2
    out = head.step(features[: min(true, last + 1)], torch.tensor(tokens[1 : min(true, last + 1) + 1]), None, 0)
    predicted = list(out)
    for t in range(min(true, last + 1), last + 1):
        seq = torch.stack([*features[:true], *predicted[true - 1 : t]])
        predicted.append(head.step(seq, torch.tensor(tokens[1 : t + 2]), None, 0)[-1])
    return predicted[last]


def test_the_head_cache_gives_what_a_recompute_from_scratch_gives(pair):
    target = pair[0]
    head = target.__dict__[FEATURE_HEAD]
    runner = HFRunner(target, 64)
    proposer = FeatureProposer(runner, head, Sampling(), None)
    try:
        tokens = list(PROMPT)
        runner.extend(tokens, 1)  # the target runs the prompt: its features are read
        features = proposer.features[: len(tokens)].clone()
        before = proposer.features.clone()
        assert proposer.draft(tokens + [7], len(tokens)) is not None
        assert torch.equal(proposer.features, before)  # the head's own use of the target's norm is not a feature
        for extra in ([7], [7, 8], [7, 8, 9]):  # drafting on from its own predictions
            got = proposer._advance(tokens + extra, len(tokens + extra) - 2)
            want = reference(head, features, tokens + extra, len(tokens))
            assert torch.allclose(got, want, atol=1e-9)
        runner.extend([7, 8], 1)  # verified: the true features of 7 and 8 replace the predictions
        runner.crop(len(tokens) + 1)  # 8 rejected: 7 stays
        features = proposer.features[: len(tokens) + 1].clone()
        for extra in ([7, 2], [7, 2, 5]):
            got = proposer._advance(tokens + extra, len(tokens + extra) - 2)
            want = reference(head, features, tokens + extra, len(tokens) + 1)
            assert torch.allclose(got, want, atol=1e-9)
    finally:
        proposer.close()


TREES = [("sd", {}, "2x2x1"), ("sd", {}, "d8"), ("we_sd", {"lambda": 0.5}, "3x1"), ("cd_se", {"alpha": 0.3}, "d6")]


@pytest.mark.spread("proposer")  # make test: each method and shape with the head alone or chained, in turn
@pytest.mark.parametrize("proposer", ["eagle", "eagle+draft"])
@pytest.mark.parametrize("method,args,tree", TREES, ids=[f"{m}-{t}" for m, _, t in TREES])
def test_greedy_trees_drafted_by_the_head_equal_the_standard_method(pair, method, args, tree, proposer):
    standard = {"sd": "large_model"}.get(method, method.rsplit("_", 1)[0])
    gamma = [2, 1] if method.endswith("_se") else 3
    base = generate(pair, PROMPT, standard, max_new_tokens=40, method_args=args).token_ids
    out = generate(pair, PROMPT, method, gamma, 40, method_args={**args, "proposer": proposer}, tree=tree)
    assert out.token_ids == base
    assert out.stats.proposers["eagle"].proposed > out.stats.rounds  # several candidates a round: a tree
    assert out.stats.proposers["eagle"].accepted > 0
    assert not pair[0].model.norm._forward_pre_hooks


def test_a_tree_keeps_the_features_of_its_accepted_path_in_order(pair, monkeypatch):
    """After a round the head drafts from the true features of the accepted path: those a plain forward of the
    committed tokens gives (a tree forward writes them at the slots of its nodes, compacted after the round)."""
    seen = []
    original = FeatureProposer.logits

    def logits(self, context):
        row = original(self, context)
        if row is not None:  # none before the target's first forward
            true = min(self.runner.length, len(context) - 1)
            seen.append((list(context[:true]), self.features[:true].clone()))
        return row

    monkeypatch.setattr(FeatureProposer, "logits", logits)
    generate(pair, PROMPT, "sd", 3, 30, method_args={"proposer": "eagle"}, tree="d8")
    target = pair[0]
    assert len(seen) > 10
    for context, features in seen[:: max(1, len(seen) // 8)]:
        assert torch.allclose(features, true_features(target, context), atol=1e-9)


def true_features(target, context: list[int]) -> torch.Tensor:
    """The target's features before its final norm over ``context``, from one forward without a cache."""
    found = []
    hook = target.model.norm.register_forward_pre_hook(lambda _m, a: found.append(a[0][0]))
    try:
        target(input_ids=torch.tensor([context]), use_cache=False)
    finally:
        hook.remove()
    return found[0]


def test_eagle_without_a_head_is_refused_in_one_line():
    models = [tiny_llama(50, vocab=64), tiny_llama(51, vocab=64)]
    with pytest.raises(ArgumentError, match="proposer 'eagle' needs a feature head attached") as err:
        generate(models, PROMPT, "sd", 2, 10, method_args={"proposer": "eagle"})
    assert "\n" not in str(err.value)


def eagle_checkpoint(path, target, layers=1, bias=True, fc_shape=None):
    """A checkpoint in EAGLE's published layout: config.json plus pytorch_model.bin holding fc.* and layers.N.*
    (the decoder layer's own names), as the EAGLE repository saves them; its weights random."""
    torch.manual_seed(5)
    source = FeatureHead(target, None, layers, bias)
    state = {k.removeprefix("decoder."): v for k, v in source.own_state().items()}
    del state["layers.0.input_layernorm.weight"]  # EAGLE's first decoder layer has no input norm
    if fc_shape is not None:
        state["fc.weight"] = torch.zeros(fc_shape, dtype=state["fc.weight"].dtype)
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**target.config.to_dict(), "num_hidden_layers": layers}))
    torch.save(state, path / "pytorch_model.bin")
    return source


@pytest.mark.parametrize("layers,bias", [(1, True), (2, False)])
def test_a_published_eagle_checkpoint_loads_as_the_head(pair, tmp_path, layers, bias):
    target = copy.deepcopy(pair[1])
    source = eagle_checkpoint(tmp_path / "eagle", target, layers, bias)
    head = load_head(tmp_path / "eagle", target)
    assert target.__dict__[FEATURE_HEAD] is head and len(head.decoder.layers) == layers
    assert isinstance(head.decoder.layers[0].input_layernorm, torch.nn.Identity)
    for key, value in source.own_state().items():
        if key != "decoder.layers.0.input_layernorm.weight":
            assert torch.equal(head.own_state()[key], value), key
    base = generate([target], PROMPT, "large_model", max_new_tokens=20).token_ids
    assert generate([target], PROMPT, "sd", 3, 20, method_args={"proposer": "eagle"}).token_ids == base


def test_a_saved_head_loads_back_the_same(pair, tmp_path):
    target = copy.deepcopy(pair[1])
    source = FeatureHead(target, [1, 2, 3, 60])
    save_head(source, tmp_path / "head", {"teacher": "t"})
    head = load_head(tmp_path / "head", target)
    assert head.kept.tolist() == [1, 2, 3, 60]
    assert all(torch.equal(head.own_state()[k], v) for k, v in source.own_state().items())


def test_a_checkpoint_of_another_model_is_refused_in_one_line(pair, tmp_path):
    target = copy.deepcopy(pair[1])
    eagle_checkpoint(tmp_path / "wrong", target, fc_shape=(8, 16))
    with pytest.raises(ModelError, match=r"fc.weight of shape \(8, 16\), the target needs \(32, 64\)"):
        load_head(tmp_path / "wrong", target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="neither this project's feature_head.json nor an EAGLE checkpoint"):
        load_head(tmp_path / "empty", target)


TINY_HEAD = {"prompts": 2, "new_tokens": 4, "source_chunks": 1, "chunk_tokens": 32, "eval_prompts": 1, "steps": 3}


def test_a_model_spec_trains_its_head_once_and_loads_it_attached(tiny_dir, tmp_path, monkeypatch):
    from pipeline.models import ModelSpec, load_spec

    resolve_module = importlib.import_module("pipeline.models.resolve")  # the package exports a function of that name

    monkeypatch.setenv("SPECENS_CACHE", str(tmp_path / "cache"))
    spec = ModelSpec("tiny", str(tiny_dir), eagle=TINY_HEAD)
    model, _ = load_spec(spec)
    head = model.__dict__[FEATURE_HEAD]
    made = resolve_module.ensure_head(spec)
    meta = json.loads((made / "draft.json").read_text())
    assert made.parent == tmp_path / "cache" / "heads" and meta["kind"] == "feature_head" and meta["steps"] == 3
    other = resolve_module.ensure_head(ModelSpec("tiny", str(tiny_dir), eagle={**TINY_HEAD, "steps": 4}))
    assert other != made  # another recipe, another cache entry
    monkeypatch.setattr(resolve_module, "distill_head", lambda *a: pytest.fail("trained twice"))
    again, _ = load_spec(spec)  # cached: loaded, not trained
    # the same model under another config name is the same model: its head is the cached one, not trained again
    assert resolve_module.ensure_head(ModelSpec("tiny-with-head", str(tiny_dir), eagle=TINY_HEAD)) == made
    assert all(torch.equal(again.__dict__[FEATURE_HEAD].own_state()[k], v) for k, v in head.own_state().items())
    by_dir, _ = load_spec(ModelSpec("tiny", str(tiny_dir), eagle=str(made)))
    assert FEATURE_HEAD in by_dir.__dict__


@pytest.mark.parametrize(
    "eagle, message",
    [
        ({"stepz": 3}, "eagle settings for 'tiny': unknown key 'stepz'; accepted: layers, head_tokens"),
        ({"cls_weight": -1}, r"feature head cls_weight=-1: expected a finite number of 0 or more"),
        ("/nonexistent/head", "eagle='/nonexistent/head' for model 'tiny': no such directory"),
    ],
)
def test_a_bad_eagle_entry_is_refused_in_one_line(tiny_dir, eagle, message):
    from pipeline.models import ModelSpec
    from pipeline.models.resolve import ensure_head

    with pytest.raises(ModelError, match=message):
        ensure_head(ModelSpec("tiny", str(tiny_dir), eagle=eagle))


def test_the_config_check_refuses_eagle_without_a_head():
    import yaml

    from pipeline.experiment.config import ConfigError, check_config
    from pipeline.models.spec import DEFAULT_CONFIG

    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config["grids"][1]["proposer"] = "eagle"
    with pytest.raises(ConfigError, match=r"grids\[1\].proposer: eagle drafts from a feature head of the set's large"):
        check_config(config)
    config["models"]["smollm2-135m-instruct"]["eagle"] = {"steps": 400}
    assert check_config(config)["grids"][1]["proposer"] == "eagle"


def test_a_heads_recipe_or_directory_is_checked_when_the_config_is_read(tmp_path):
    """A model's ``eagle`` entry is checked with the config, before any job: a recipe's keys and values, a
    directory that is missing, holds no head, or a ``feature_head.json`` that is not one, each one line naming the
    model, whether or not a grid uses it yet."""
    import yaml

    from pipeline.experiment.config import ConfigError, check_config
    from pipeline.models.spec import DEFAULT_CONFIG

    (tmp_path / "empty").mkdir()
    (tmp_path / "listed").mkdir()
    (tmp_path / "listed" / "feature_head.json").write_text("[1, 2]")
    (tmp_path / "stringy").mkdir()
    (tmp_path / "stringy" / "feature_head.json").write_text(json.dumps({"layers": "2"}))
    for eagle, says in (
        ({"stepz": 3}, "unknown key 'stepz'"),
        ({"noise": -1}, "feature head noise=-1: expected a finite number of 0 or more"),
        ({"layout": "eagle4"}, "feature head layout='eagle4': accepted: ours, eagle, eagle3"),
        ({"layout": "eagle3", "ttt": 0}, "feature head ttt=0: expected a whole number from 1 to 16"),
        (str(tmp_path / "nowhere"), "nowhere is not a directory"),
        (str(tmp_path / "empty"), "holds neither this project's feature_head.json nor an EAGLE checkpoint"),
        (str(tmp_path / "listed"), "a JSON object expected, not list"),
        (str(tmp_path / "stringy"), 'layers="2"; expected a whole number from 1'),
    ):
        config = yaml.safe_load(DEFAULT_CONFIG.read_text())
        config["models"]["smollm2-135m-instruct"]["eagle"] = eagle
        with pytest.raises(ConfigError, match="config key models.smollm2-135m-instruct.eagle: ") as err:
            check_config(config)
        assert says in str(err.value) and "\n" not in str(err.value), err.value


# ---- EAGLE's layout: features after the final norm, as published and as vLLM runs it ----------------------------


def passing_head(target, layout: str, embedding: float = 0.0) -> FeatureHead:
    """A head whose prediction is the feature it reads (plus ``embedding`` times the next token's embedding):
    ``fc`` passes the feature half, the decoder layer adds nothing. Its logits for input t are then what the
    target's output head makes of that feature."""
    head = FeatureHead(target, None, 1, bias=False, layout=layout)
    d = target.config.hidden_size
    with torch.no_grad():
        eye = torch.eye(d, dtype=head.fc.weight.dtype)
        head.fc.weight.copy_(torch.cat([embedding * eye, eye], 1))
        head.decoder.layers[0].self_attn.o_proj.weight.zero_()
        head.decoder.layers[0].mlp.down_proj.weight.zero_()
    return head


@pytest.mark.parametrize("layout", ["eagle", "ours"])
def test_a_heads_layout_says_which_side_of_the_final_norm_it_reads(pair, layout):
    """A passing head's proposal after ``context`` is the target's own next-token logits at position
    len(context) - 2 in either layout, each reading its side of the final norm: EAGLE's reads after it and
    feeds the output head directly; ours reads before it and puts its prediction through it. A norm weight other
    than one tells the sides apart (a unit-weight RMS norm applied twice is applied once)."""
    target = copy.deepcopy(pair[1])
    with torch.no_grad():
        target.model.norm.weight.uniform_(0.5, 2.0)
    head = attach(target, passing_head(target, layout)).__dict__[FEATURE_HEAD]
    runner = HFRunner(target, 64)
    proposer = FeatureProposer(runner, head, Sampling(), None)
    try:
        runner.extend(list(PROMPT), 1)
        logits = target(input_ids=torch.tensor([PROMPT])).logits[0]
        for pos in (3, 7, len(PROMPT)):
            assert torch.allclose(proposer.logits(PROMPT[:pos]), logits[pos - 2], atol=1e-9), pos
    finally:
        proposer.close()
    assert not target.model.norm._forward_hooks and not target.model.norm._forward_pre_hooks
    if layout == "eagle":  # the features it trains on: the decoder's last hidden states, after the norm
        found = target_features(target, [torch.tensor([PROMPT])], "eagle")[0]
        final = target(input_ids=torch.tensor([PROMPT]), output_hidden_states=True).hidden_states[-1][0]
        assert torch.allclose(found, final.float(), atol=1e-6)


def test_greedy_outputs_with_a_head_of_eagles_layout_equal_the_standard_method(pair):
    target = copy.deepcopy(pair[0])
    torch.manual_seed(2)
    attach(target, FeatureHead(target, None, 1, bias=False, layout="eagle"))
    models = [target, pair[1]]
    for method, args, standard in (("sd", {}, "large_model"), ("we_sd", {"lambda": 0.5}, "we")):
        base = generate(models, PROMPT, standard, max_new_tokens=30, method_args=args).token_ids
        out = generate(models, PROMPT, method, 3, 30, method_args={**args, "proposer": "eagle"})
        assert out.token_ids == base and out.stats.proposers["eagle"].proposed > 0
    assert not target.model.norm._forward_hooks  # it stopped reading the target's features


def test_a_head_of_eagles_layout_is_saved_as_an_eagle_checkpoint(pair, tmp_path):
    """Saved, it is a checkpoint in EAGLE's published layout (the target's config.json of its layer count and
    model.safetensors under EAGLE's names), which loads back the same as this project's head and as a published
    checkpoint."""
    from safetensors.torch import load_file

    target = copy.deepcopy(pair[1])
    torch.manual_seed(4)
    source = FeatureHead(target, None, 2, bias=False, layout="eagle")
    save_head(source, tmp_path / "head", {"teacher": "t"})
    files = sorted(p.name for p in (tmp_path / "head").iterdir())
    assert files == ["config.json", "draft.json", "feature_head.json", "model.safetensors"]
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 32 and config["vocab_size"] == 64
    names = set(load_file(tmp_path / "head" / "model.safetensors"))
    assert "fc.weight" in names and "layers.1.input_layernorm.weight" in names
    assert "layers.0.input_layernorm.weight" not in names and not any(n.startswith("decoder.") for n in names)
    mine = load_head(tmp_path / "head", target)
    (tmp_path / "head" / "feature_head.json").unlink()  # read as a published checkpoint
    published = load_head(tmp_path / "head", copy.deepcopy(pair[1]))
    for head in (mine, published):
        assert head.layout == "eagle" and isinstance(head.decoder.layers[0].input_layernorm, torch.nn.Identity)
        assert head.own_state().keys() == source.own_state().keys()
        assert all(torch.equal(head.own_state()[k], v) for k, v in source.own_state().items())


def test_a_head_saved_before_layouts_were_named_loads_as_this_projects(pair, tmp_path):
    target = copy.deepcopy(pair[1])
    save_head(FeatureHead(target, None), tmp_path / "head", {})
    config = json.loads((tmp_path / "head" / "feature_head.json").read_text())
    (tmp_path / "head" / "feature_head.json").write_text(json.dumps({k: v for k, v in config.items() if k != "layout"}))
    assert load_head(tmp_path / "head", target).layout == "ours"
    with pytest.raises(ModelError, match=r"feature head layout='eagle1': accepted: ours, eagle"):
        FeatureHead(target, None, layout="eagle1")


def test_a_damaged_or_foreign_head_is_refused_in_one_line_as_it_loads(pair, tmp_path):
    """Every tensor's shape against the head the target needs (a head of another model of the same width: its
    decoder layer differs, not its fc), weights finite, the checkpoint's config.json against the target's, the
    head's own config (a list, a string layer count, kept ids outside the target's rows), layer names that are
    not layers 0 to N (``layers.999999.*`` builds no million-layer decoder), and a file torch's safe loader
    refuses: each one line naming it, no traceback, no head attached."""
    import pickle

    from safetensors.torch import load_file, save_file

    target = copy.deepcopy(pair[1])
    d = target.config.hidden_size
    save_head(FeatureHead(target, [1, 2, 3]), tmp_path / "good", {})
    state = load_file(tmp_path / "good" / "feature_head.safetensors")
    config = json.loads((tmp_path / "good" / "feature_head.json").read_text())
    mlp = next(k for k in state if k.endswith("mlp.up_proj.weight"))
    cases = {
        "another decoder layer": ({**state, mlp: torch.zeros(7, d)}, config, rf"{mlp} of shape \(7, {d}\)"),
        "NaN weights": ({**state, mlp: state[mlp] * float("nan")}, config, f"{mlp} holds NaN or infinite weights"),
        "a list": (state, [1, 2], "a JSON object expected, not list"),
        "a string layer count": (state, {**config, "layers": "1"}, 'layers="1"; expected a whole number from 1'),
        "kept outside": (state, {**config, "kept": [1, 10**6]}, "kept is not a list of distinct ids below"),
        "a million layers": (state, {**config, "layers": 10**6}, "says 1000000 layers, its weights hold 1"),
        "layer 999999": (
            {**state, "decoder.layers.999999.mlp.up_proj.weight": state[mlp].clone()},
            config,
            r"its layers.N.\* tensors are not layers 0 to N",
        ),
    }
    for case, (weights, head_config, says) in cases.items():
        out = tmp_path / case.replace(" ", "-")
        out.mkdir()
        save_file(weights, out / "feature_head.safetensors")
        (out / "feature_head.json").write_text(json.dumps(head_config))
        with pytest.raises(ModelError, match=says):
            load_head(out, target)
        assert FEATURE_HEAD not in target.__dict__, case
    eagle_checkpoint(tmp_path / "rope", target)
    (tmp_path / "rope" / "config.json").write_text(
        json.dumps({**target.config.to_dict(), "num_hidden_layers": 1, "rope_theta": 1.5})
    )
    with pytest.raises(
        ModelError, match="its config.json has rope_theta=1.5, the target .*: it was trained for another"
    ):
        load_head(tmp_path / "rope", target)

    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    eagle_checkpoint(tmp_path / "pickle", target)
    (tmp_path / "pickle" / "pytorch_model.bin").write_bytes(pickle.dumps({"fc.weight": Evil()}))
    with pytest.raises(ModelError) as err:
        load_head(tmp_path / "pickle", target)
    assert "pytorch_model.bin cannot be read (" in str(err.value) and "\n" not in str(err.value)
    assert FEATURE_HEAD not in target.__dict__


def test_a_heads_recipe_loss_is_the_loss_its_head_trains_on(pair):
    """``eagle: {loss: ...}`` names the next token's part of the head's loss (as a draft's ``loss``): ``kl`` is
    EAGLE's forward KL to the teacher at each labelled row after the first, ``ce`` and ``tvd`` are the draft's
    losses seen one position on; three recipes, three losses (they once trained one head under three names)."""
    from pipeline.models.feature_head import HeadRecipe
    from pipeline.models.head_training import head_loss
    from pipeline.models.teacher import Example

    target = copy.deepcopy(pair[1])
    head = FeatureHead(target, None, 1)
    n, k = 9, target.config.vocab_size
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, k, (1, n), generator=g)
    features = torch.randn(n, target.config.hidden_size, generator=g, dtype=target.dtype)
    rows = torch.tensor([0, 2, 3, 6, 8])
    logp = torch.randn(len(rows), k, generator=g, dtype=target.dtype).log_softmax(-1)
    labels = torch.full((n,), -100)
    labels[rows] = logp.argmax(-1)
    example = Example(ids, labels, rows, logp)
    losses = {}
    for name in ("ce", "kl", "tvd"):
        recipe = HeadRecipe(loss=name, noise=0.0, cls_weight=1.0)
        losses[name] = float(head_loss(head, example, features, recipe, None, 1.0).detach())
    regression = float(head_loss(head, example, features, HeadRecipe(noise=0.0, cls_weight=0.0), None, 1.0).detach())
    with torch.no_grad():
        predicted = head.step(features[:-1], ids[0, 1:], None, 0)
        logq = head.kept_logits(predicted[rows[1:] - 1]).log_softmax(-1)  # EAGLE's KL, written out
    kl = float((logp[1:].exp() * (logp[1:] - logq)).sum(-1).mean())
    tvd = 1 - float(torch.minimum(logp[1:].exp(), logq.exp()).sum(-1).mean())
    ce = float(torch.nn.functional.cross_entropy(logq, labels[rows[1:]]))
    assert abs(losses["kl"] - regression - kl) < 1e-9 and abs(losses["tvd"] - regression - tvd) < 1e-9
    assert abs(losses["ce"] - regression - ce) < 1e-9 and len(set(losses.values())) == 3


def test_the_heads_time_is_its_proposal_cost_per_drafted_token(pair):
    """A head is a named proposer that runs a network: its forwards are counted and timed, and the cell's proposal
    cost is their seconds per drafted token over one target forward's (as a lookup's seconds are)."""
    out = generate(pair, PROMPT, "sd", 3, 30, method_args={"proposer": "eagle"})
    stats = out.stats.to_dict()
    head = stats["proposers"]["eagle"]
    assert head["proposed"] > 0 and head["forward_calls"] >= head["proposed"] and head["forward_time_s"] > 0
    target = stats["models"][0]
    expected = head["forward_time_s"] / head["proposed"] / (target["forward_time_s"] / target["forward_calls"])
    assert decoding_metrics([stats])["proposal_cost"] == pytest.approx(expected)
