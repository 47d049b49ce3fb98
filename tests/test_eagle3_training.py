"""EAGLE-3-style heads trained here (``pipeline/models/eagle3_training.py``, a head recipe's ``layout: eagle3``): the
training-time test computes what drafting a chain computes, training lowers the loss of every step, a head trained
with it drafts its later tokens better than one trained on true features alone, it is saved as an EAGLE-3
checkpoint that loads back as a published one, it drafts exactly, and recipes that cannot train are one line."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.proposers.feature import attach
from pipeline.models import ModelError
from pipeline.models.eagle3 import Eagle3Head
from pipeline.models.eagle3_training import layer_scales, new_head, ttt_loss, ttt_outputs
from pipeline.models.feature_head import HeadRecipe
from pipeline.models.head_files import load_head, save_head
from pipeline.models.head_training import target_features, train_head
from pipeline.models.teacher import Example, TeacherData

from .conftest import tiny_llama
from .test_eagle3 import reference_rows

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1]
KEPT = sorted(torch.randperm(64, generator=torch.Generator().manual_seed(3))[:40].tolist())


@pytest.fixture(scope="module")
def deep():
    """A target of 8 layers: EAGLE-3's rule fuses the inputs of its layers 2, 4 and 5."""
    return tiny_llama(50, vocab=64, hidden=32, layers=8)


@torch.no_grad()
def data_of(teacher, kept=KEPT, seed: int = 0, train: int = 24, held: int = 6, length: int = 20) -> TeacherData:
    """Random sequences labelled by ``teacher`` at every position, its distribution over the ``kept`` ids (the
    columns a head's data holds), and held-out (prompt, continuation, log-probabilities) triples."""
    vocab = teacher.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    index = torch.full((vocab,), -100, dtype=torch.long)
    index[torch.tensor(kept)] = torch.arange(len(kept))
    examples = []
    for _ in range(train):
        ids = torch.randint(0, vocab, (1, length), generator=g)
        logp = teacher(ids).logits[0].log_softmax(-1)
        examples.append(Example(ids, index[logp.argmax(-1)], torch.arange(length), logp[:, kept]))
    triples = []
    for _ in range(held):
        seq = torch.randint(0, vocab, (length,), generator=g).tolist()
        triples.append((seq[:8], seq[8:], teacher(torch.tensor([seq])).logits[0, 7:-1].log_softmax(-1)))
    return TeacherData(examples, list(kept), 1.0, triples, 0.0)


def recipe(**change) -> HeadRecipe:
    return HeadRecipe(**{"layout": "eagle3", "steps": 150, "lr": 1e-2, "warmup": 5, "noise": 0.0, **change})


def test_the_training_time_test_computes_what_drafting_a_chain_computes(deep):
    """Step j's row t equals the feature a chain drafted from anchor t reaches after j tokens, through the head's
    own KV cache: its true prefix 0..t and its own drafts, nothing else (a wrong mask is off by O(1); transformers'
    eager attention takes its softmax in float32, hence the 1e-6 relative tolerance)."""
    head = new_head(deep, KEPT)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
        ids = torch.randint(0, 64, (12,), generator=g)
        hidden = target_features(deep, [ids[None]], head)[0].double()
        steps = list(ttt_outputs(head, ids, hidden, 3))
        checked = 0
        for t in range(11):
            cache = head.new_cache()
            feature = head.step(head.fuse(hidden[: t + 1]), ids[1 : t + 2], cache, 0)[-1]
            for j in range(3):
                if j:
                    if t + j + 1 >= 12:
                        break
                    feature = head.step(feature[None], ids[t + j + 1 : t + j + 2], cache, t + j)[0]
                scale = feature.abs().max()
                assert (steps[j][t] - feature).abs().max() <= 1e-6 * scale, (t, j)
                checked += 1
    assert checked == 11 + 10 + 9


@pytest.fixture(scope="module")
def trained(deep):
    """Heads trained on the same data for as many steps: with the training-time test (3 steps) and without (1)."""
    data = data_of(deep)
    with_ttt, facts = train_head(copy.deepcopy(deep), data, recipe(ttt=3))
    without, _ = train_head(copy.deepcopy(deep), data, recipe(ttt=1))
    return data, with_ttt, without, facts


def chain_loss(head, teacher, data: TeacherData, steps: int = 3) -> list[float]:
    """The head's forward KL to the teacher at each step of a drafted chain (teacher-forced tokens, its own
    features), over the training sequences: what ``ttt_loss`` trains, step by step."""
    losses = []
    features = target_features(teacher, [e.ids for e in data.examples], head)
    with torch.no_grad():
        for j in range(steps):
            one = HeadRecipe(layout="eagle3", ttt=j + 1, noise=0.0)
            parts = []
            for e, f in zip(data.examples, features):
                upto = ttt_loss(head, e, f, one) * sum(0.8**i for i in range(j + 1))
                before = ttt_loss(head, e, f, HeadRecipe(layout="eagle3", ttt=j, noise=0.0)) if j else 0.0
                parts.append((upto - before * sum(0.8**i for i in range(j))) / 0.8**j)
            losses.append(float(sum(parts)) / len(parts))
    return losses


def test_training_lowers_every_steps_loss_and_the_test_helps_later_tokens(deep, trained):
    """Against an untrained head every step's loss falls (from 3.3 at each step); the head trained with the
    training-time test drafts its second and third tokens better than the one trained on the true features alone
    (measured: KL 0.76 and 0.77 against 1.31 and 1.36), and pays for it on its first (0.76 against 0.53)."""
    data, with_ttt, without, facts = trained
    start = chain_loss(new_head(deep, KEPT), deep, data)
    ttt, plain = chain_loss(with_ttt, deep, data), chain_loss(without, deep, data)
    assert all(a < b for a, b in zip(ttt, start)), (ttt, start)
    assert ttt[1] < plain[1] and ttt[2] < plain[2], (ttt, plain)
    assert ttt[0] < 2 * plain[0], (ttt, plain)
    assert 0 < facts["acceptance_t1"] <= 1 and facts["steps"] == 150


def test_a_trained_head_is_saved_as_an_eagle3_checkpoint_and_loads_back(deep, trained, tmp_path):
    data, head, _, _ = trained
    save_head(head, tmp_path / "h", {"kind": "feature_head"})
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == len(KEPT)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert not (tmp_path / "h" / "feature_head.json").exists()
    target = copy.deepcopy(deep)
    loaded = load_head(tmp_path / "h", target)
    assert isinstance(loaded, Eagle3Head) and loaded.kept.tolist() == KEPT
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "h" / "model.safetensors")
    assert weights["t2d"].sum() == len(KEPT) and weights["t2d"][torch.tensor(KEPT)].all()
    theta = config["rope_theta"]
    want = reference_rows(
        target, {k: v.double() if v.is_floating_point() else v for k, v in weights.items()}, PROMPT, (2, 4, 5), theta
    )
    with torch.no_grad():
        hidden = target_features(target, [torch.tensor([PROMPT])], loaded)[0]
        got = torch.stack(
            [loaded.logits(f) for f in loaded.step(loaded.fuse(hidden[:-1]), torch.tensor(PROMPT[1:]), None, 0)]
        )
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)) and torch.allclose(got[finite], want[finite], atol=1e-8)


@pytest.mark.parametrize("method,gamma,tree", [("sd", 3, None), ("sd", 3, "2x2"), ("we_se", [2, 3], None)])
def test_greedy_outputs_with_a_trained_eagle3_head_equal_the_standard_method(deep, trained, method, gamma, tree):
    model = copy.deepcopy(deep)
    attach(model, trained[1])
    other = tiny_llama(77, vocab=64, hidden=32, layers=1, init=0.8)
    pair = [model, other]
    args = {"lambda": 0.5} if method == "we_se" else {}
    base = generate(pair, PROMPT, "we" if method == "we_se" else "large_model", max_new_tokens=40, method_args=args)
    proposer = "eagle+draft" if method == "we_se" else "eagle"
    out = generate(pair, PROMPT, method, gamma, 40, method_args={**args, "proposer": proposer}, tree=tree)
    assert out.token_ids == base.token_ids and out.stats.proposers["eagle"].verified > 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"layout": "eagle", "ttt": 4}, "feature head ttt=4: the training-time test is EAGLE-3's (layout: eagle3)"),
        ({"ttt": 0}, "feature head ttt=0: expected a whole number from 1 to 16"),
        ({"ttt": "3"}, "feature head ttt='3': expected a whole number from 1 to 16"),
        ({"cls_weight": 1.0}, "feature head cls_weight=1.0: an eagle3 head's loss is the next token's alone"),
        ({"layers": 2}, "feature head layers=2: an eagle3 head has one layer, its midlayer"),
        ({"layout": "eagle4"}, "feature head layout='eagle4': accepted: ours, eagle, eagle3"),
    ],
)
def test_a_recipe_that_cannot_train_is_one_line(change, message):
    with pytest.raises(ModelError) as err:
        HeadRecipe(**{"layout": "eagle3", **change})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_target_too_shallow_for_eagle3s_rule_is_one_line():
    with pytest.raises(ModelError, match=r"EAGLE-3's rule \(2, L // 2, L - 3\) gives layers \[2, 2, 1\]"):
        new_head(tiny_llama(1, vocab=32, hidden=16, layers=4), list(range(32)))


def brute_chains(head, teacher, prompt, cont, best, gamma: int) -> list[list[int]]:
    """``chain_drafts`` written plainly: every draft recomputed from the whole sequence before it, no cache (true
    fused features up to the anchor, the head's own outputs after), stopping where a kept token leaves ``cont``."""
    seq, chains = prompt + cont, []
    with torch.no_grad():
        true = head.fuse(target_features(teacher, [torch.tensor([seq])], head)[0])
        for j in range(len(cont)):
            p, chain = len(prompt) + j - 2, []
            chains.append(chain)
            inputs, tokens = list(true[: max(p + 1, 0)]), seq[1 : p + 2]
            for d in range(min(gamma, len(cont) - j) if p >= 0 else 0):
                out = head.step(torch.stack(inputs), torch.tensor(tokens), None, 0)[-1]
                chain.append(int(head.logits(out).argmax()))
                if chain[-1] != best[j + d] or best[j + d] != cont[j + d]:
                    break
                inputs, tokens = [*inputs, out], [*tokens, best[j + d]]
    return chains


def own_judge(head, teacher, held):
    """``held`` with each continuation the head's own: token by token its first draft from the teacher's true
    features of the prompt and the tokens before, each judged one-hot. Every first draft is then kept, and a chain
    runs on as far as drafting from its own features agrees with drafting from the true ones."""
    out = []
    with torch.no_grad():
        for prompt, cont, _ in held:
            seq = list(prompt)
            for _ in cont:
                true = head.fuse(target_features(teacher, [torch.tensor([seq])], head)[0])
                seq.append(int(head.logits(head.step(true[:-1], torch.tensor(seq[1:]), None, 0)[-1]).argmax()))
            mine = seq[len(prompt) :]
            logp = torch.full((len(mine), head.vocab_size), -30.0, dtype=torch.float64)
            out.append((prompt, mine, logp.scatter_(1, torch.tensor(mine)[:, None], 0.0)))
    return out


def test_chain_drafts_are_what_drafting_each_chain_from_scratch_drafts(deep, trained):
    """``chain_drafts`` (what the heads benchmark's tau counts) against chains recomputed without a cache, for a
    trained EAGLE-3 head and one of this project's layout, judged by the teacher and on the head's own
    continuations (every chain then reaches its second draft, from the head's own feature); ``chain_acceptance``
    counts them, and its first depth is ``head_acceptance``'s agreement."""
    from pipeline.models.feature_head import FeatureHead
    from pipeline.models.head_training import chain_acceptance, chain_drafts, head_acceptance

    data, eagle3, _, _ = trained
    second = 0
    for head in (eagle3, FeatureHead(deep, None, 1)):
        for held in (data.held, own_judge(head, deep, data.held)):
            reached, kept = [0] * 3, [0] * 3
            for prompt, cont, logp in held:
                best = logp.argmax(-1).tolist()
                chains = chain_drafts(head, deep, prompt, cont, best, 3)
                assert chains == brute_chains(head, deep, prompt, cont, best, 3)
                for j, chain in enumerate(chains):
                    for d, token in enumerate(chain):
                        reached[d], kept[d] = reached[d] + 1, kept[d] + (token == best[j + d])
            got = chain_acceptance(head, deep, held, gamma=3)
            assert got["tau"] == round(1 + sum(kept) / reached[0], 4) and reached[0] > 0
            assert got["depth_acceptance"][0] == head_acceptance(head, deep, held)["agreement"]
            second += reached[1]
    assert second > 100  # drafts from the head's own features were compared


def test_each_layers_noise_is_in_its_own_scale_without_the_first_position():
    low, high = torch.full((5, 2), 3.0), torch.full((5, 2), 40.0)
    features = torch.cat([low, torch.full((5, 2), 4.0), high], 1)
    features[0] = 1000.0  # the first position's outsized values (an attention sink) do not count
    assert layer_scales([features, features[:3]]).tolist() == [3.0, 3.0, 4.0, 4.0, 40.0, 40.0]


def test_an_ensembles_choice_off_the_continuation_ends_a_chain_unjudged(deep, trained):
    """Where the judge (an ensemble) keeps a token the continuation does not have, its later rows were computed
    on the continuation, so the chain is not judged past it: every chain that keeps that token ends there."""
    from pipeline.models.head_training import chain_drafts

    data, head, _, _ = trained
    prompt, cont, logp = own_judge(head, deep, data.held[:1])[0]
    best = logp.argmax(-1).tolist()
    chains = chain_drafts(head, deep, prompt, cont, best, 3)
    off = [*cont[:4], (cont[4] + 1) % 64, *cont[5:]]  # the judge's token at 4 is no longer the continuation's
    moved = chain_drafts(head, deep, prompt, off, best, 3)
    for j in range(5):  # drafted from the same tokens as before: cut after index 4 where it was kept
        cut = len(chains[j]) > 4 - j and chains[j][4 - j] == best[4]
        assert moved[j] == (chains[j][: 5 - j] if cut else chains[j]), j
    assert len(chains[4]) >= 2 and moved[4] == chains[4][:1]  # its first draft kept, its second not judged


def test_a_sequence_with_no_row_to_score_is_a_zero_loss_training_takes(deep):
    head = new_head(deep, KEPT)
    ids = torch.tensor([[5, 9]])
    example = Example(ids, torch.tensor([3, -100]), torch.tensor([0]), torch.zeros(1, len(KEPT)))
    hidden = target_features(deep, [ids], head)[0]
    loss = ttt_loss(head, example, hidden, recipe())  # its one row predicts x_1: nothing the head drafts
    loss.backward()
    assert float(loss) == 0.0 and head.fc.weight.grad is not None


def test_on_a_bfloat16_target_a_new_heads_rotary_frequencies_stay_float32(deep):
    head = new_head(copy.deepcopy(deep).to(torch.bfloat16), KEPT)
    assert head.fc.weight.dtype == torch.bfloat16 and head.rotary.inv_freq.dtype == torch.float32


def test_over_the_whole_vocabulary_a_head_is_saved_without_d2t_its_rows_in_the_targets_order(deep, tmp_path):
    """vLLM's EAGLE-3 takes a ``d2t`` only for a draft vocabulary smaller than the target's: a head over the whole
    vocabulary (in any order) is saved with its rows in the target's order and none, and loads back the same."""
    order = torch.randperm(64, generator=torch.Generator().manual_seed(5)).tolist()
    head = new_head(deep, order)
    with torch.no_grad():
        head.lm_head.weight.mul_(3.0)
    save_head(head, tmp_path / "h", {})
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "h" / "model.safetensors")
    assert "d2t" not in weights and "t2d" not in weights
    loaded = load_head(tmp_path / "h", copy.deepcopy(deep))
    feature = torch.randn(32, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(loaded.logits(feature), head.logits(feature), atol=1e-12)


def test_a_saved_heads_files_replaced_by_a_pipe_or_a_list_are_one_line_never_a_wait(deep, tmp_path):
    """A pipe in place of the weights or of config.json, a list where eagle_config's mapping belongs: each one
    line, from the loader and from vLLM's side, and the config check does not wait on the pipe."""
    import os

    from pipeline.errors import UserError
    from pipeline.vllm.eagle import checkpoint, entry_problem

    save_head(new_head(deep, KEPT), tmp_path / "pipe", {})
    os.unlink(tmp_path / "pipe" / "model.safetensors")
    os.mkfifo(tmp_path / "pipe" / "model.safetensors")
    with pytest.raises(ModelError, match=r"model.safetensors is not a regular file \(a device or a pipe\)"):
        load_head(tmp_path / "pipe", copy.deepcopy(deep))
    assert entry_problem("eagle3", "m", str(tmp_path / "pipe")) is None  # told when the job starts, in one line
    with pytest.raises(UserError, match=r"model.safetensors is not a regular file"):
        checkpoint(tmp_path / "pipe", "eagle3")

    save_head(new_head(deep, KEPT), tmp_path / "conf", {})
    os.unlink(tmp_path / "conf" / "config.json")
    os.mkfifo(tmp_path / "conf" / "config.json")
    with pytest.raises(UserError, match=r"^vllm_eagle3: the checkpoint's config .*config.json is not a regular file"):
        checkpoint(tmp_path / "conf", "eagle3")

    save_head(new_head(deep, KEPT), tmp_path / "list", {})
    config = json.loads((tmp_path / "list" / "config.json").read_text())
    (tmp_path / "list" / "config.json").write_text(json.dumps({**config, "eagle_config": [1]}))
    with pytest.raises(ModelError, match=r"^EAGLE-3 head: eagle_config=\[1\]; expected a mapping$"):
        load_head(tmp_path / "list", copy.deepcopy(deep))
