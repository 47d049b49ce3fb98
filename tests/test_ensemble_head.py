"""Feature heads trained for an ensemble (a head recipe's ``target``, ``pipeline/models/head_target.py``): each
training row is the ensemble's own distribution, a head so trained is accepted more by that ensemble than one
trained on its model alone, it drafts exactly in every method that verifies (greedy identity and chi-square, in
chains and trees), and a target that cannot be trained is refused in one line where the config is read."""

from __future__ import annotations

import copy
import importlib
import json

import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.proposers.feature import FEATURE_HEAD, attach
from pipeline.models import ModelError
from pipeline.models.feature_head import HeadRecipe
from pipeline.models.head_target import distribution, ensemble_target, for_ensemble
from pipeline.models.head_training import head_loss, target_features, train_head
from pipeline.models.teacher import Example, TeacherData

from .conftest import tiny_llama
from .test_sampling_lossless import SETTINGS, TWO, check_case, make_models

WE = {"method": "we", "members": ["other"], "method_args": {"lambda": 0.5}}
CD = {"method": "cd", "members": ["other"], "method_args": {"alpha": 0.3, "beta": 0.1}}


@torch.no_grad()
def synthetic_data(teacher, seed: int = 0, train: int = 24, held: int = 6, length: int = 20) -> TeacherData:
    """Random sequences labelled by ``teacher`` at every position (as ``teacher_data`` labels source chunks), and
    held-out (prompt, continuation, log-probabilities) triples: a head's data without a tokenizer."""
    vocab = teacher.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(train):
        ids = torch.randint(0, vocab, (1, length), generator=g)
        logp = teacher(ids).logits[0].log_softmax(-1)
        examples.append(Example(ids, logp.argmax(-1), torch.arange(length), logp))
    triples = []
    for _ in range(held):
        seq = torch.randint(0, vocab, (length,), generator=g).tolist()
        logp = teacher(torch.tensor([seq])).logits[0, 7:-1].log_softmax(-1)
        triples.append((seq[:8], seq[8:], logp))
    return TeacherData(examples, list(range(vocab)), 1.0, triples, 0.0)


@pytest.fixture(scope="module")
def trio():
    """A target, another model of its vocabulary that disagrees with it, and their data."""
    target = tiny_llama(40, vocab=64, hidden=32, layers=2)
    other = tiny_llama(77, vocab=64, hidden=32, layers=1, init=0.8)
    return target, other, synthetic_data(target)


@pytest.mark.parametrize("value", [WE, CD], ids=["we", "cd"])
def test_each_training_row_is_the_ensembles_distribution(trio, value):
    target, other, data = trio
    ens = for_ensemble(data, [target, other], distribution(ensemble_target(value), [target, other]))
    e, mine = data.examples[3], ens.examples[3]
    with torch.no_grad():
        a, b = target(e.ids).logits[0], other(e.ids).logits[0]
    if value["method"] == "we":  # written out: half of each member's softmax
        want = 0.5 * a.softmax(-1) + 0.5 * b.softmax(-1)
    else:  # contrastive decoding: l_expert - alpha * l_amateur over the plausible set (the expert's top tokens)
        plausible = a.softmax(-1) >= 0.1 * a.softmax(-1).max(-1, keepdim=True).values
        want = (a - 0.3 * b).masked_fill(~plausible, float("-inf")).softmax(-1)
    assert torch.allclose(mine.logp.exp(), want, atol=1e-9) and torch.isfinite(mine.logp).all()
    assert torch.equal(mine.labels, want.argmax(-1)) and not torch.equal(mine.labels, e.labels)
    prompt, cont, _ = data.held[0]
    with torch.no_grad():
        rows = [m(torch.tensor([prompt + cont])).logits[0, len(prompt) - 1 : -1] for m in (target, other)]
    held = ens.held[0][2].exp()
    if value["method"] == "we":
        assert torch.allclose(held, 0.5 * rows[0].softmax(-1) + 0.5 * rows[1].softmax(-1), atol=1e-9)
    assert held.shape == (len(cont), 64) and torch.allclose(held.sum(-1), torch.ones(len(cont), dtype=held.dtype))


def trained(target, data, steps: int = 600):
    recipe = HeadRecipe(steps=steps, lr=1e-2, warmup=5, noise=0.0, cls_weight=1.0, head_tokens=0)
    head, _ = train_head(copy.deepcopy(target), data, recipe)
    return head


@pytest.fixture(scope="module")
def heads(trio):
    """The same head trained on the same sequences for as many steps, for the target alone and for ``we``."""
    target, other, data = trio
    ens = for_ensemble(data, [target, other], distribution(ensemble_target(WE), [target, other]))
    return trained(target, data), trained(target, ens), ens


def rejection(head, teacher, data: TeacherData) -> float:
    """The head's mean rejection rate at T=1 (total variation, 1 - sum of min(p, q)) against each row's
    distribution in ``data``, its first proposal from the true features: the ``tvd`` part of its loss."""
    with_tvd, without = HeadRecipe(noise=0.0, cls_weight=1.0, loss="tvd"), HeadRecipe(noise=0.0, cls_weight=0.0)
    features = target_features(teacher, [e.ids for e in data.examples], head.layout)
    with torch.no_grad():
        parts = [
            head_loss(head, e, f, with_tvd, None, 1.0) - head_loss(head, e, f, without, None, 1.0)
            for e, f in zip(data.examples, features)
        ]
    return float(sum(parts)) / len(parts)


def test_a_head_trained_for_the_ensemble_is_accepted_more_by_it(trio, heads):
    """Same sequences, steps and seed: each head is rejected least by the distribution it was trained on (measured
    at 600 steps: 0.34 against 0.65 by the target, 0.47 against 0.56 by ``we``)."""
    target, _, data = trio
    alone, for_we, ens = heads
    by_target = [rejection(h, target, data) for h in (alone, for_we)]
    by_we = [rejection(h, target, ens) for h in (alone, for_we)]
    assert by_we[1] < by_we[0] - 0.05 and by_target[0] < by_target[1] - 0.05, (by_target, by_we)


@pytest.mark.parametrize(
    "method,args,gamma,tree",
    [
        ("we_se", {"lambda": 0.5}, [2, 3], None),
        ("we_sd", {"lambda": 0.5}, 3, "2x2"),
        ("cd_se", {"alpha": 0.3}, [2, 1], "d6"),
    ],
)
def test_greedy_outputs_with_an_ensemble_head_equal_the_standard_method(trio, heads, method, args, gamma, tree):
    target, other, _ = trio
    model = copy.deepcopy(target)
    attach(model, heads[1])
    pair = [model, other]
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1]
    base = generate(pair, prompt, method.split("_")[0], max_new_tokens=40, method_args=args).token_ids
    out = generate(pair, prompt, method, gamma, 40, method_args={**args, "proposer": "eagle+draft"}, tree=tree)
    assert out.token_ids == base and out.stats.proposers["eagle"].verified > 0  # its proposals were verified


@pytest.fixture(scope="module")
def sampling_models():
    """The chi-square models, the target with a head trained for its ``we`` with the draft beside it."""
    models = make_models()
    data = synthetic_data(models[0], seed=5)
    target = ensemble_target({"method": "we", "members": ["draft"], "method_args": {"lambda": 0.5}})
    ens = for_ensemble(data, models[:2], distribution(target, models[:2]))
    head = trained(models[0], ens, steps=100)
    model = copy.deepcopy(models[0])
    attach(model, head)
    return [model, *models[1:]]


CASES = [
    (
        "we_se",
        [0, 1],
        "we",
        {"weights": [0.5, 0.5]},
        {"method_args": {**TWO["we"], "proposer": "eagle+draft"}, "gamma": [1, 2]},
    ),
    (
        "we_sd",
        [0, 1],
        "we",
        {"weights": [0.5, 0.5]},
        {"method_args": {**TWO["we"], "proposer": "eagle"}, "gamma": 2, "tree": "2x1"},
    ),
]


@pytest.mark.exhaustive  # the eagle proposer's own chi-square cases run in the quick tier (test_feature_head.py)
@pytest.mark.parametrize("case", CASES, ids=["we_se-chain", "we_sd-tree"])
def test_first_two_tokens_follow_the_ensemble(sampling_models, case):
    check_case(sampling_models, case, SETTINGS[0])


TINY = {"prompts": 2, "new_tokens": 4, "source_chunks": 1, "chunk_tokens": 32, "eval_prompts": 1, "steps": 3}


def test_a_model_spec_trains_its_ensemble_head_with_the_members_loaded(tiny_dir, tiny_dir2, tmp_path, monkeypatch):
    from pipeline.models import ModelSpec, load_spec

    resolve_module = importlib.import_module("pipeline.models.resolve")
    monkeypatch.setenv("SPECENS_CACHE", str(tmp_path / "cache"))
    member = {"name": "tiny2", "source": str(tiny_dir2)}
    target = {"method": "we", "members": [member], "method_args": {"lambda": 0.5}}
    spec = ModelSpec("tiny", str(tiny_dir), eagle={**TINY, "target": target})
    model, _ = load_spec(spec)
    made = resolve_module.ensure_head(spec)
    meta = json.loads((made / "draft.json").read_text())
    assert meta["target"] == "we(+tiny2, lambda=0.5)" and meta["recipe"]["target"]["members"] == [member]
    assert 0 < meta["acceptance_t1"] <= 1 and FEATURE_HEAD in model.__dict__
    alone = resolve_module.ensure_head(ModelSpec("tiny", str(tiny_dir), eagle=TINY))
    assert alone != made and json.loads((alone / "draft.json").read_text())["target"] == "model"


@pytest.mark.parametrize(
    "target, message",
    [
        ({**WE, "method": "we_se"}, r"eagle.target method='we_se': expected an ensemble method|target method='we_se'"),
        ({**WE, "members": ["nobody"]}, r"eagle.target.members: 'nobody' is not a model of this config; accepted: "),
        ({**WE, "members": []}, r"target members=\[\]: expected a list of the other models' names"),
        ({**WE, "members": ["other"] * 9, "method_args": {}}, r"target members: 9 models; accepted: 1 to 8"),
        ({**WE, "method_args": {"lambda": 2}}, r"lambda=2 is outside the accepted range \[0, 1\]"),
        ({**WE, "weight": 1}, r"target: unknown key 'weight'; accepted: method, members, method_args"),
        ("ensemble", r"target='ensemble': accepted: 'model', or \{method"),
    ],
)
def test_a_target_that_cannot_be_trained_is_refused_when_the_config_is_read(target, message):
    from pipeline.experiment.config import ConfigError, _check_heads

    models = {"big": {"source": "bundled", "eagle": {"target": target}}, "other": {"source": "bundled"}}
    with pytest.raises(ConfigError, match=message) as err:
        _check_heads(models)
    assert "\n" not in str(err.value)


def test_a_member_of_the_target_is_given_with_its_own_source():
    """The head's cache name hashes its recipe: a member named in the config is hashed with its source and its
    own recipe, so that another member makes another head."""
    from pipeline.models.spec import config_entry

    models = {
        "big": {"source": "bundled", "eagle": {"target": WE}},
        "other": {"distill": {"teacher": "big", "layers": 2}, "eagle": {}},
    }
    members = config_entry(models, "big")["eagle"]["target"]["members"]
    assert members[0]["name"] == "other" and members[0]["distill"]["layers"] == 2 and "eagle" not in members[0]
    assert members[0]["distill"]["teacher"]["name"] == "big"


def test_a_recipe_with_the_wrong_members_is_refused(trio):
    from pipeline.models.head_training import distill_head

    target, _, _ = trio
    with pytest.raises(ModelError, match="is trained with 1 other members, got 0"):
        distill_head(target, None, None, HeadRecipe(target=WE), "big")
