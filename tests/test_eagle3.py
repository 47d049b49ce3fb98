"""EAGLE-3 heads as published (``pipeline/models/eagle3.py``): a synthetic checkpoint written here in that layout
(``fc`` over three layers' inputs, ``midlayer`` of 2d attention inputs, its own ``norm``, ``lm_head`` over a
reduced draft vocabulary and ``d2t``) loads, agrees with an independent plain-torch forward of the published
architecture, is exact in ``sd`` and every ``*_sd`` / ``*_se`` method in chains and trees (greedy identity and
the chi-square check, both failing once proposals go unverified), passes the audit, and is refused in one line
where it does not fit the target."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from pipeline.decoding import generate, loop
from pipeline.decoding.audit import Audit
from pipeline.decoding.proposers.feature import FEATURE_HEAD
from pipeline.models import ModelError
from pipeline.models.eagle3 import Eagle3Head
from pipeline.models.head_files import head_dir_problem, load_head

from .conftest import perturbed, tiny_llama
from .test_feature_head import EAGLE_CASES
from .test_sampling_lossless import SETTINGS, VOCAB, check_case, chi_square_pvalue, empirical_joint, exact_joint

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1]


def eagle3_checkpoint(path, target, ids=None, aux=None, seed=0, scale=1.0, config=None, drop=(), state=None):
    """A checkpoint in EAGLE-3's published layout for ``target``: ``config.json`` (the head's shapes, one layer,
    ``draft_vocab_size``; ``eagle_config`` naming ``aux`` layers where given) and ``model.safetensors`` with
    ``fc.weight`` [d, 3d], ``midlayer.*`` (q/k/v over 2d inputs), ``norm.weight``, ``lm_head.weight`` over the draft
    ids ``ids`` (default: the whole vocabulary), ``d2t`` (draft id i -> target id i + d2t[i]), ``t2d`` and a copy of
    the target's embedding, as some releases hold. Random weights, peaked enough to propose differently."""
    from safetensors.torch import save_file

    c = target.config
    d, heads, kv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    hd, inter, vocab = d // heads, c.intermediate_size, c.vocab_size
    ids = list(range(vocab)) if ids is None else list(ids)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, s=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * s / math.sqrt(shape[-1])

    def norm_weight():
        return 1.0 + 0.1 * torch.randn(d, generator=gen, dtype=torch.float64)

    weights = {
        "fc.weight": rand(d, 3 * d, s=2.0),
        "midlayer.input_layernorm.weight": norm_weight(),
        "midlayer.hidden_norm.weight": norm_weight(),
        "midlayer.post_attention_layernorm.weight": norm_weight(),
        "midlayer.self_attn.q_proj.weight": rand(heads * hd, 2 * d, s=2.0),
        "midlayer.self_attn.k_proj.weight": rand(kv * hd, 2 * d, s=2.0),
        "midlayer.self_attn.v_proj.weight": rand(kv * hd, 2 * d),
        "midlayer.self_attn.o_proj.weight": rand(d, heads * hd),
        "midlayer.mlp.gate_proj.weight": rand(inter, d),
        "midlayer.mlp.up_proj.weight": rand(inter, d),
        "midlayer.mlp.down_proj.weight": rand(d, inter),
        "norm.weight": norm_weight(),
        "lm_head.weight": rand(len(ids), d, s=4.0 * scale),
        "d2t": torch.tensor(ids) - torch.arange(len(ids)),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, torch.tensor(ids), True),
        "embed_tokens.weight": target.get_input_embeddings().weight.detach().clone(),
    }
    weights = {k: v for k, v in {**weights, **(state or {})}.items() if k not in drop}
    settings = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": d,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "draft_vocab_size": len(ids),
        "tie_word_embeddings": False,
    }
    if aux is not None:
        settings["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux), "use_aux_hidden_state": True}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**settings, **(config or {})}))
    save_file({k: v.contiguous() for k, v in weights.items()}, path / "model.safetensors")
    return path, weights


# ---- an independent forward of the published architecture, in plain torch ----------------------------------------


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, positions, theta):
    """Rotary embedding of ``x`` [n, heads, hd] at ``positions`` (the rotate-half convention)."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angle = positions[:, None].double() * inv[None]
    cos, sin = torch.cat([angle.cos(), angle.cos()], -1)[:, None], torch.cat([angle.sin(), angle.sin()], -1)[:, None]
    half = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
    return x * cos + half * sin


def reference_rows(target, w, tokens, aux, theta):
    """Full-vocabulary logits rows of the head after each position t < n - 1 of ``tokens``, from the target's true
    features: g_t = fc(the inputs of layers ``aux``), then the midlayer on (embed x_{t+1}, g_t) at position t."""
    c = target.config
    eps, heads, kv = c.rms_norm_eps, c.num_attention_heads, c.num_key_value_heads
    with torch.no_grad():
        hidden = target(
            input_ids=torch.tensor([tokens]), output_hidden_states=True
        ).hidden_states  # [i]: layer i's input
        g = torch.cat([hidden[i][0] for i in sorted(aux)], -1) @ w["fc.weight"].T
        e = target.get_input_embeddings().weight[torch.tensor(tokens[1:])]
        g = g[:-1]
        n, hd = g.shape[0], c.hidden_size // heads
        x = torch.cat(
            [rms(e, w["midlayer.input_layernorm.weight"], eps), rms(g, w["midlayer.hidden_norm.weight"], eps)], -1
        )
        pos = torch.arange(n)
        q = rope((x @ w["midlayer.self_attn.q_proj.weight"].T).view(n, heads, hd), pos, theta)
        k = rope((x @ w["midlayer.self_attn.k_proj.weight"].T).view(n, kv, hd), pos, theta)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(n, kv, hd)
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        attended = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * hd)
        r = g + attended @ w["midlayer.self_attn.o_proj.weight"].T
        m = rms(r, w["midlayer.post_attention_layernorm.weight"], eps)
        mlp = (
            torch.nn.functional.silu(m @ w["midlayer.mlp.gate_proj.weight"].T)
            * (m @ w["midlayer.mlp.up_proj.weight"].T)
        ) @ w["midlayer.mlp.down_proj.weight"].T
        out = r + mlp
        small = rms(out, w["norm.weight"], eps) @ w["lm_head.weight"].T
        ids = torch.arange(small.shape[1]) + w["d2t"]
        full = small.new_full((n, c.vocab_size), float("-inf"))
        full[:, ids] = small
    return full


@pytest.fixture(scope="module")
def deep():
    """A target of 8 layers (EAGLE-3's rule fuses the inputs of layers 2, 4 and 5) with a head over 40 of its 64
    ids, and a draft."""
    return tiny_llama(50, vocab=64, hidden=32, layers=8)


@pytest.fixture(scope="module")
def head_dir(deep, tmp_path_factory):
    ids = sorted(torch.randperm(64, generator=torch.Generator().manual_seed(3))[:40].tolist())
    return eagle3_checkpoint(tmp_path_factory.mktemp("eagle3"), deep, ids=ids)


def test_a_published_checkpoint_loads_and_matches_an_independent_forward(deep, head_dir):
    path, weights = head_dir
    target = copy.deepcopy(deep)
    head = load_head(path, target)
    assert isinstance(head, Eagle3Head) and head.aux_layers == (2, 4, 5) and target.__dict__[FEATURE_HEAD] is head
    assert head_dir_problem(path) is None  # a config naming it passes the config check
    tokens = PROMPT + [7, 8, 2, 30, 41, 5]
    theta = json.loads((path / "config.json").read_text())["rope_theta"]
    expected = reference_rows(target, weights, tokens, (2, 4, 5), theta)
    hidden = []
    from pipeline.decoding.proposers.feature import read_features

    hooks = read_features(target, head, lambda h: hidden.append(h[0]))
    with torch.no_grad():
        target(input_ids=torch.tensor([tokens]))
    hooks.remove()
    features = head.fuse(hidden[0])
    with torch.no_grad():
        out = head.step(features[:-1], torch.tensor(tokens[1:]), None, 0)
        rows = torch.stack([head.logits(f) for f in out])
        cache, stepped = head.new_cache(), []  # the same inputs one at a time through its KV cache
        for t in range(len(tokens) - 1):
            stepped.append(head.step(features[t : t + 1], torch.tensor(tokens[t + 1 : t + 2]), cache, t)[0])
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(rows)) and finite[0].sum() == 40  # the draft ids, probability 0 else
    assert torch.allclose(rows[finite], expected[finite], atol=1e-5, rtol=1e-5)  # rope: float32 in transformers
    assert torch.allclose(torch.stack(stepped), out, atol=1e-12)


def test_the_three_layers_follow_eagle3s_rule_or_the_checkpoints_own(tmp_path):
    four = tiny_llama(51, vocab=32, hidden=16, layers=4)
    with pytest.raises(
        ModelError, match=r"^EAGLE-3 head: EAGLE-3's rule \(2, L // 2, L - 3\) gives layers \[2, 2, 1\]"
    ):
        load_head(eagle3_checkpoint(tmp_path / "a", four)[0], copy.deepcopy(four))
    head = load_head(eagle3_checkpoint(tmp_path / "b", four, aux=[3, 0, 1])[0], copy.deepcopy(four))
    assert head.aux_layers == (0, 1, 3)
    with pytest.raises(ModelError, match=r"its eagle_aux_hidden_state_layer_ids gives layers \[0, 1, 4\]"):
        load_head(eagle3_checkpoint(tmp_path / "c", four, aux=[0, 1, 4])[0], copy.deepcopy(four))


# ---- exactness: greedy identity in chains and trees, failing once proposals go unverified --------------------------


@pytest.fixture(scope="module")
def pair(deep, head_dir):
    target = copy.deepcopy(deep)
    load_head(head_dir[0], target)
    return [target, perturbed(deep, 0.2, seed=52)]


SPECULATIVE = [
    ("sd", {}, 3, None),
    ("we_sd", {"lambda": 0.5}, 3, None),
    ("we_se", {"lambda": 0.5}, [2, 3], None),
    ("cd_sd", {"alpha": 0.3}, 2, None),
    ("gac_se", {"lambda": 0.5, "threshold": 0.4}, [1, 2], None),
    ("sd", {}, 3, "2x2x1"),
    ("sd", {}, 3, "d8"),
    ("we_sd", {"lambda": 0.5}, 3, "3x1"),
    ("cd_se", {"alpha": 0.3}, [2, 1], "d6"),
]


@pytest.mark.spread("proposer")  # each method and tree once in make test, the proposers in turn (tests/tiers.py)
@pytest.mark.parametrize("proposer", ["eagle", "eagle+draft"])
@pytest.mark.parametrize(
    "method,args,gamma,tree", SPECULATIVE, ids=[f"{m}-{t or 'chain'}" for m, _, _, t in SPECULATIVE]
)
def test_greedy_outputs_equal_the_standard_method(pair, method, args, gamma, tree, proposer):
    standard = {"sd": "large_model"}.get(method, method.rsplit("_", 1)[0])
    base = generate(pair, PROMPT, standard, max_new_tokens=40, method_args=args).token_ids
    out = generate(pair, PROMPT, method, gamma, 40, method_args={**args, "proposer": proposer}, tree=tree)
    assert out.token_ids == base
    assert out.stats.proposers["eagle"].proposed > 0
    assert not any(layer._forward_pre_hooks for layer in pair[0].model.layers)  # it stopped reading the features


def test_greedy_identity_fails_once_the_heads_proposals_go_unverified(pair, monkeypatch):
    base = generate(pair, PROMPT, "large_model", max_new_tokens=40).token_ids
    monkeypatch.setattr(loop, "verify_greedy", lambda target, proposed: (len(proposed), None))
    out = generate(pair, PROMPT, "sd", 3, 40, method_args={"proposer": "eagle"})
    assert out.token_ids != base


def test_every_distribution_matches_a_recompute_from_scratch(pair):
    """The audit: every distribution the head drew a proposal from, recomputed from scratch (the target's features
    from one forward without a cache, the head without its cache), chain and tree, greedy and sampled."""
    for tree, temperature in ((None, 0.0), (None, 1.0), ("2x2", 1.0)):
        audit = Audit(pair[:1])
        out = generate(
            pair[:1],
            PROMPT,
            "sd",
            3,
            24,
            method_args={"proposer": "eagle"},
            temperature=temperature,
            seed=1,
            audit=audit,
            tree=tree,
        )
        assert out.stats.proposers["eagle"].proposed > 0 and audit.checked > 0


# ---- sampling: the first two tokens follow the target's distribution (chi-square) -----------------------------------


@pytest.fixture(scope="module")
def sampling_models(tmp_path_factory):
    """A target of 3 layers (the checkpoint names all three) with a head over 4 of the 6 ids, and a draft."""
    target = tiny_llama(10, vocab=VOCAB, hidden=16, layers=3, init=0.6)
    draft = perturbed(target, 0.35, seed=11)
    path, _ = eagle3_checkpoint(tmp_path_factory.mktemp("small"), target, ids=[0, 2, 3, 5], aux=[0, 1, 2], seed=4)
    with_head = copy.deepcopy(target)
    load_head(path, with_head)
    return [with_head, draft]


CASES = [EAGLE_CASES[i] for i in (0, 2, 4, 5)]  # test_feature_head's: sd chain and tree, we_se, we_sd d4


def case_id(case) -> str:
    return "-".join([case[0], case[4]["method_args"]["proposer"], case[4].get("tree", "chain")])


# make test: the head alone in a chain and in a tree; the chained ensembles' cases (20 s each) in make test-all
QUICK = [  # make test: sd in a tree (test_feature_head's quick cases run the head in chains); the rest in CI
    pytest.param(c, id=case_id(c), marks=() if c[0] == "sd" and "tree" in c[4] else pytest.mark.exhaustive)
    for c in CASES
]


@pytest.mark.parametrize("case", QUICK)
def test_first_two_tokens_follow_the_target(sampling_models, case):
    check_case(sampling_models, case, SETTINGS[0])


def test_the_check_fails_once_the_heads_proposals_go_unverified(sampling_models, monkeypatch):
    def accept_all(target, proposed, draft, generator):
        return len(proposed), None

    monkeypatch.setattr(loop, "verify_sampled", accept_all)
    expected = exact_joint("single", sampling_models[:1], SETTINGS[0], {})
    counts = empirical_joint(sampling_models[:1], "sd", SETTINGS[0], gamma=2, method_args={"proposer": "eagle"})
    assert chi_square_pvalue(counts, expected) < 1e-6


# ---- refused in one line where it does not fit -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,message",
    [
        ({"config": {"hidden_size": 48}}, r"hidden_size 48 \(target_hidden_size 48\); the target's is 32"),
        ({"config": {"num_hidden_layers": 2}}, r"num_hidden_layers=2; the layout read here has one layer"),
        ({"config": {"draft_vocab_size": 10}}, r"draft_vocab_size=10 but lm_head.weight has 64 rows"),
        (
            {"drop": ("midlayer.hidden_norm.weight",)},
            r"1 of its weights missing \(first: midlayer.hidden_norm.weight\)",
        ),
        (
            {"state": {"fc.weight": torch.zeros(32, 64, dtype=torch.float64)}},
            r"fc.weight of shape \(32, 64\), the target needs \(32, 96\)",
        ),
        ({"state": {"norm.weight": torch.full((32,), float("nan"), dtype=torch.float64)}}, r"norm.weight holds NaN"),
        ({"state": {"d2t": torch.full((64,), 5)}}, r"d2t maps draft ids outside the target's 64 ids"),
        ({"state": {"d2t": -torch.arange(64)}}, r"d2t maps two draft ids to one target id"),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_refused_in_one_line(deep, tmp_path, change, message):
    path, _ = eagle3_checkpoint(tmp_path / "h", deep, **change)
    with pytest.raises(ModelError, match=rf"^EAGLE-3 checkpoint {tmp_path}/h: {message}") as err:
        load_head(path, copy.deepcopy(deep))
    assert "\n" not in str(err.value)


def test_vllms_eagle_refuses_an_eagle3_checkpoint_in_one_line(deep, head_dir):
    from pipeline.errors import UserError
    from pipeline.vllm.eagle import checkpoint

    with pytest.raises(UserError, match=r"^vllm_eagle: .* is an EAGLE-3 checkpoint; vLLM's EAGLE \(EAGLE-1's layout\)"):
        checkpoint(head_dir[0])
    assert checkpoint(head_dir[0], "eagle3") == head_dir[0]


def test_a_config_giving_vllms_eagle_an_eagle3_head_is_refused_when_read(head_dir):
    from pipeline.vllm.eagle import entry_problem

    assert entry_problem("eagle", "smol", str(head_dir[0])) == (
        f"model 'smol''s head {head_dir[0]} is an EAGLE-3 checkpoint; vLLM's EAGLE (EAGLE-1's layout) cannot run it: "
        "vllm_eagle3 does"
    )
    assert entry_problem("eagle3", "smol", str(head_dir[0])) is None


def test_on_a_bfloat16_target_the_heads_rotary_frequencies_stay_float32(deep, head_dir):
    target = copy.deepcopy(deep).to(torch.bfloat16)
    head = load_head(head_dir[0], target)
    assert head.fc.weight.dtype == torch.bfloat16 and head.rotary.inv_freq.dtype == torch.float32
    exact = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    assert torch.allclose(head.rotary.inv_freq, exact.to(head.rotary.inv_freq.dtype), rtol=1e-6)


def test_the_checkpoints_own_rope_wins_over_the_targets(deep, tmp_path):
    path, _ = eagle3_checkpoint(tmp_path / "h", deep, config={"rope_theta": 500000.0})
    head = load_head(path, copy.deepcopy(deep))
    theta = head.config.rope_parameters["rope_theta"] if head.config.rope_parameters else head.config.rope_theta
    assert theta == 500000.0


def test_a_checkpoint_naming_no_rope_takes_the_published_default_base_not_the_targets(tmp_path):
    """EAGLE-3's own reader, vLLM's (llama_eagle3) and SGLang's give a head whose config.json names no rope_theta
    Llama's default base, 10,000, whatever the target's: on a target of base 500,000 the head's rotary frequencies
    are 10,000's (they were the target's before)."""
    target = tiny_llama(50, vocab=64, hidden=32, layers=8)
    target.config.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
    path, _ = eagle3_checkpoint(tmp_path / "h", target)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "rope_theta"}))
    head = load_head(path, copy.deepcopy(target))
    exact = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    assert torch.allclose(head.rotary.inv_freq.float(), exact, rtol=1e-6)
