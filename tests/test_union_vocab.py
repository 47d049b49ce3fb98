"""Models with different tokenizers: the union vocabulary, its maps, and every union method's exactness.

Tiny tokenizers of both conventions (``union_fixtures.py``: a GPT-2 style
byte-level BPE and a SentencePiece-style one with ``▁`` and ``<0xNN>`` byte
fallback) and tiny random float64 Llama models over them. The maps are
checked on hand-worked cases; greedy speculative forms must emit the tokens
of ``we`` / ``gac`` over the union; the first two union tokens sampled by each
method must follow the exact joint computed by enumeration here (a reference
written again from the contract, with the warp of ``test_sampling_lossless``);
the audit recomputes every distribution over 110 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.decoding import generate
from pipeline.decoding.audit import Audit, AuditError
from pipeline.decoding.joined import Joined, UnionRunner
from pipeline.decoding.union import END, JoinError, byte_level_table, check_joinable, split
from pipeline.errors import ArgumentError, UserError

from .conftest import tiny_llama
from .test_sampling_lossless import chi_square_pvalue, ref_probs
from .union_fixtures import byte_level, gpt_style, gpt_style_other, sentencepiece, sp_style


@pytest.fixture(scope="module")
def toks():
    return gpt_style(), sp_style(), gpt_style_other()


@pytest.fixture(scope="module")
def hetero(toks):
    """Three models, one per tokenizer; the second a perturbed copy of a model of the first's shape, so
    proposals are sometimes accepted and sometimes not."""
    a, b, c = toks
    return [
        tiny_llama(1, vocab=len(a), init=0.6),
        tiny_llama(2, vocab=len(b), init=0.6),
        tiny_llama(3, len(c), init=0.6),
    ]


def ids_of(union, *strings: bytes) -> list[int]:
    return [union.ids[s] for s in strings]


# ---- the maps, worked by hand ----------------------------------------------------------------------------


def test_byte_level_table_is_a_bijection_onto_bytes():
    table = byte_level_table()
    assert sorted(table.values()) == list(range(256))
    assert (table["Ġ"], table["Ċ"], table["a"], table["Ã"], table["Ā"], table["ā"]) == (32, 10, 97, 0xC3, 0, 1)


def test_union_of_a_byte_level_and_a_sentencepiece_tokenizer(toks):
    a, b, _ = toks
    union = check_joinable([a, b])
    # every regular token's surface bytes, once; both EOS are the one end symbol; <unk> and <s> are not in U
    assert set(union.strings) == {END, b"a", b"b", b"c", b" ", b"\n", b"ab", b" a", b"bc", b"ba"}
    ga, sp = union.members
    gpt_ids = {t: i for i, t in enumerate(["<|endoftext|>", "a", "b", "c", "Ġ", "Ċ", "ab", "Ġa", "bc"])}
    sp_ids = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", "<0x0A>", "<0x61>", "a", "b", "c", "▁", "▁a", "ba"])}
    want_gpt = {"<|endoftext|>": END, "Ġ": b" ", "Ċ": b"\n", "Ġa": b" a", "ab": b"ab", "a": b"a"}
    for tok, raw in want_gpt.items():
        assert ga.index[gpt_ids[tok]] == union.ids[raw], tok
    want_sp = {"</s>": END, "<0x0A>": b"\n", "<0x61>": b"a", "a": b"a", "▁": b" ", "▁a": b" a", "ba": b"ba"}
    for tok, raw in want_sp.items():
        assert sp.index[sp_ids[tok]] == union.ids[raw], tok
    assert sp.index[sp_ids["<unk>"]] == sp.index[sp_ids["<s>"]] == union.size  # outside U
    # each member's own tokens for each union string: its own token where it has one (the regular "a",
    # not the byte-fallback duplicate), else the fewest of its tokens
    enc = {raw: (ga.encodings[u], sp.encodings[u]) for raw, u in union.ids.items()}
    assert enc[b"a"] == ((gpt_ids["a"],), (sp_ids["a"],))
    assert enc[b"\n"] == ((gpt_ids["Ċ"],), (sp_ids["<0x0A>"],))
    assert enc[b" a"] == ((gpt_ids["Ġa"],), (sp_ids["▁a"],))
    assert enc[b"ab"] == ((gpt_ids["ab"],), (sp_ids["a"], sp_ids["b"]))
    assert enc[b"bc"] == ((gpt_ids["bc"],), (sp_ids["b"], sp_ids["c"]))
    assert enc[b"ba"] == ((gpt_ids["b"], gpt_ids["a"]), (sp_ids["ba"],))
    assert enc[END] == ((gpt_ids["<|endoftext|>"],), (sp_ids["</s>"],))


def test_a_distribution_is_summed_over_duplicates(toks, hetero):
    """P_m(u) is the sum over the member's tokens standing for u: "a" and <0x61> both feed b"a"."""
    a, b, _ = toks
    union = check_joinable([a, b])
    sp = union.members[1]
    logits = torch.randn(2, len(b), dtype=torch.float64)
    joined = Joined(union, a.encode("ab"), _greedy(), _stats())
    got = joined.to_union(sp, logits).exp()
    p = torch.softmax(logits.masked_fill(sp.index.eq(union.size), float("-inf")), dim=-1)
    assert torch.allclose(got[:, union.ids[b"a"]], p[:, 4] + p[:, 5])  # <0x61> and a
    assert torch.allclose(got[:, union.ids[END]], p[:, 2])
    assert torch.allclose(got.sum(-1), torch.ones(2, dtype=torch.float64))


def test_split_takes_the_fewest_tokens_then_the_longest_first():
    own = {b"a": 1, b"ab": 2, b"bc": 3, b"c": 4, b"abc": 5, b"\xc3": 6}
    assert split(b"abc", own, 3) == (5,)
    del own[b"abc"]
    assert split(b"abc", own, 2) == (2, 4)  # ab+c and a+bc tie at two tokens: the longest first token wins
    assert split(b"aab", own, 2) == (1, 2)
    assert split(b"\xc3a", own, 2) == (6, 1)  # bytes that are not valid UTF-8 are split like any other
    assert split(b"abd", own, 2) is None


def test_bytes_of_a_multibyte_character_across_conventions():
    """A byte-level token for the first byte of "é" (0xC3, not valid UTF-8 alone) is fed to a SentencePiece
    member as its byte-fallback token; without byte fallback the set is refused."""
    a = byte_level(["a", "Ġ", "Ã", "©", "Ã©"], [("Ã", "©")])
    b = sentencepiece(["<0xC3>", "<0xA9>", "a", "é", "▁"], [])
    union = check_joinable([a, b])
    assert b"\xc3" in union.ids and b"\xc3\xa9" in union.ids  # "é" in both conventions: one union string
    sp = union.members[1]
    assert sp.encodings[union.ids[b"\xc3"]] == (3,)
    assert sp.encodings[union.ids["é".encode()]] == (6,)
    no_fallback = sentencepiece(["a", "é", "▁"], [], byte_fallback=False)
    with pytest.raises(JoinError, match=r"model 1 cannot encode the bytes .*\\xc3"):
        check_joinable([a, no_fallback])


# ---- refusals, each one line ---------------------------------------------------------------------------------


def one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_contrastive_decoding_across_tokenizers_is_refused(toks, hetero):
    a, b, _ = toks
    for method in ("cd", "cd_sd", "cd_se"):
        with pytest.raises(ArgumentError) as err:
            generate(hetero[:2], a.encode("ab"), method, tokenizers=[a, b])
        assert "contrastive decoding needs the amateur" in one_line(err)


def test_a_tree_across_tokenizers_is_refused(toks, hetero):
    a, b, _ = toks
    with pytest.raises(ArgumentError) as err:
        generate(hetero[:2], a.encode("ab"), "we_sd", tokenizers=[a, b], tree=[2, 1], max_new_tokens=4)
    assert "tree=[2, 1] with models of different tokenizers" in one_line(err)


def test_a_missing_tokenizer_is_refused(toks, hetero):
    a, b, _ = toks
    with pytest.raises(UserError) as err:
        generate(hetero[:2], a.encode("ab"), "we", tokenizers=[a, None])
    assert "model 1 (LlamaForCausalLM) has no tokenizer" in one_line(err)
    with pytest.raises(UserError, match="expected a list of 2 tokenizers"):
        generate(hetero[:2], a.encode("ab"), "we", tokenizers=[a])
    with pytest.raises(UserError) as err:
        check_joinable([a, None], ["large", "small"])
    assert one_line(err).startswith("small has no tokenizer")


def test_tokenizers_in_another_order_than_the_models_are_refused(toks, hetero):
    a, b, _ = toks
    sizes = [int(m.get_output_embeddings().weight.shape[0]) for m in hetero[:2]]
    assert len(a) <= sizes[0] and len(b) <= sizes[1] and (len(a) > sizes[1] or len(b) > sizes[0])  # distinguishable
    with pytest.raises(ArgumentError) as err:
        generate(hetero[:2], b.encode("ab"), "we", tokenizers=[b, a], max_new_tokens=4)
    assert "must be its own model's, in the models' order" in one_line(err)


def test_unencodable_bytes_are_refused(toks):
    a, _, _ = toks
    lacking = sentencepiece(["a", "b", "c", "▁"], [], byte_fallback=False)  # no newline at all
    with pytest.raises(JoinError) as err:
        check_joinable([a, lacking], ["gpt", "sp"])
    assert "sp cannot encode the bytes '\\n'" in one_line(err)


def test_a_prompt_a_member_spells_otherwise_is_refused():
    """Both tokenizers have "A", but the second lowercases its input: it would see another prompt."""
    from tokenizers import normalizers

    first, lower = byte_level(["a", "b", "A", "Ġ"], []), byte_level(["a", "b", "A", "Ġ"], [])
    lower.backend_tokenizer.normalizer = normalizers.Lowercase()
    models = [tiny_llama(4, vocab=len(first)), tiny_llama(5, vocab=len(lower))]
    with pytest.raises(ArgumentError) as err:
        generate(models, first.encode("Ab a"), "we", tokenizers=[first, lower])
    assert "model 1 (LlamaForCausalLM)'s tokenizer encodes the prompt's text 'Ab a' as 'ab a'" in one_line(err)
    assert generate(models, first.encode("ab a"), "we", max_new_tokens=3, tokenizers=[first, lower]).stats.union_size


def test_different_vocabularies_without_tokenizers_say_to_pass_them(hetero):
    with pytest.raises(ArgumentError, match=r"pass generate\(tokenizers=\[...\]\)"):
        generate(hetero[:2], [1, 2], "we")


def test_one_tokenizer_keeps_todays_path(trio, toks):
    """Tokenizers that are all the same change nothing: the same tokens, no union."""
    target, draft, _ = trio
    for method in ("we", "we_se"):
        base = generate([target, draft], [3, 1, 4], method, gamma=2, max_new_tokens=20)
        same = generate([target, draft], [3, 1, 4], method, gamma=2, max_new_tokens=20, tokenizers=[toks[0]] * 2)
        assert same.token_ids == base.token_ids and same.pieces is None and same.stats.union_size == 0


def test_identical_slow_tokenizers_run_as_one_and_different_ones_are_one_line():
    """A slow (Python) tokenizer cannot be joined, but two identical ones need no union (docs/tokenizers.md)."""
    from transformers import ByT5Tokenizer

    from pipeline.decoding.union import JoinError

    tok = ByT5Tokenizer()
    models = [tiny_llama(70, vocab=len(tok)), tiny_llama(71, vocab=len(tok))]
    base = generate(models, [5, 6, 7], "we", max_new_tokens=6)
    same = generate(models, [5, 6, 7], "we", max_new_tokens=6, tokenizers=[tok, ByT5Tokenizer()])
    assert same.token_ids == base.token_ids and same.pieces is None
    with pytest.raises(
        JoinError, match=r"^model 0 \(LlamaForCausalLM\): its tokenizer \(ByT5Tokenizer\) is not a fast"
    ) as err:
        generate(models, [5, 6, 7], "we", max_new_tokens=6, tokenizers=[tok, ByT5Tokenizer(extra_ids=4)])
    assert "\n" not in str(err.value)


# ---- greedy: every speculative form emits the union ensemble's tokens -----------------------------------------

PROMPT_TEXT = "ab a\nab a"  # repeats: prompt lookup has matches


def _greedy():
    from pipeline.decoding.sampling import Sampling

    return Sampling()


def _stats():
    from pipeline.decoding.stats import GenerationStats

    return GenerationStats(method="we")


@pytest.mark.spread("proposer")  # make test: each ensemble with one proposer, every proposer once (tests/tiers.py)
@pytest.mark.parametrize("base", ["we", "gac"])
@pytest.mark.parametrize("proposer", ["draft", "lookup", "lookup+draft"])
def test_greedy_speculative_forms_equal_the_union_ensemble(toks, hetero, base, proposer):
    a, b, _ = toks
    models, tokenizers = hetero[:2], [a, b]
    args = {"weights": [0.6, 0.4]} if base == "we" else {"weights": [0.6, 0.4], "threshold": 0.75}
    accepted, others = 0, set()
    for text in (PROMPT_TEXT, "c", "ba bc"):
        prompt = a.encode(text)
        want = generate(models, prompt, base, max_new_tokens=30, method_args=args, tokenizers=tokenizers)
        assert len(want.pieces) == 30 and want.stats.union_size == 10 and want.stats.union_map_s > 0
        for single in ("large_model", "small_model"):  # the ensemble is neither member alone
            alone = generate(models, prompt, single, max_new_tokens=30, tokenizers=tokenizers).token_ids
            others.add((single, alone != want.token_ids))
        for variant, gammas in (("_sd", [1, 3]), ("_se", [[1, 3], [2, 2]])):
            for gamma in gammas:
                for first in (0, 1):
                    margs = {**args, "proposer": proposer, "first_proposer": first}
                    got = generate(models, prompt, base + variant, gamma, 30, method_args=margs, tokenizers=tokenizers)
                    assert got.token_ids == want.token_ids, (text, variant, gamma, first)
                    assert got.text == want.text == "".join(want.pieces)
                    accepted += got.stats.accepted
    assert accepted > 0
    assert ("large_model", True) in others and ("small_model", True) in others


def test_parallel_ensemble_and_single_targets_over_the_union(toks, hetero):
    """``we_p`` gives ``we``'s union tokens; ``sd`` with a draft of another family gives ``large_model``'s (the
    first model's P over U); a stop string ends the text."""
    a, b, _ = toks
    models, tokenizers = hetero[:2], [a, b]
    for text in (PROMPT_TEXT, "c"):
        prompt = a.encode(text)
        for base, fast, kw in (("we", "we_p", {}), ("large_model", "sd", {"gamma": 3})):
            want = generate(models, prompt, base, max_new_tokens=25, tokenizers=tokenizers).token_ids
            assert generate(models, prompt, fast, max_new_tokens=25, tokenizers=tokenizers, **kw).token_ids == want
        full = generate(models, prompt, "we", max_new_tokens=25, tokenizers=tokenizers)
        stop = full.text[5:7]
        cut = generate(models, prompt, "we", max_new_tokens=25, tokenizers=tokenizers, stop_strings=[stop])
        assert cut.stats.stop_reason == "stop_string" and stop in cut.text and full.text.startswith(cut.text)


def test_greedy_three_members_two_conventions(toks, hetero):
    weights = [0.5, 0.3, 0.2]
    for text in (PROMPT_TEXT, "cab"):
        prompt = toks[0].encode(text)
        want = generate(hetero, prompt, "we", max_new_tokens=30, method_args={"weights": weights}, tokenizers=toks)
        assert want.stats.union_size == 13  # the third adds "ca", " b" and two spaces
        for method, gamma in (("we_sd", 2), ("we_se", [1, 2, 3]), ("we_se", [3, 1, 1])):
            for first in (0, 1, 2):
                margs = {"weights": weights, "first_proposer": first}
                got = generate(hetero, prompt, method, gamma, 30, method_args=margs, tokenizers=toks)
                assert got.token_ids == want.token_ids, (text, method, gamma, first)


def test_end_symbol_stops_and_maps_every_eos(toks, hetero):
    """The first model's EOS id stops at the shared end symbol, whichever member's EOS it came from."""
    a, b, _ = toks
    ends = 0
    for seed in range(30):
        out = generate(
            hetero[:2], a.encode("ab"), "we_se", [1, 2], 40, temperature=1.5, seed=seed, tokenizers=[a, b],
            eos_token_id=a.eos_token_id, method_args={"weights": [0.2, 0.8]},
        )  # fmt: skip
        if out.stats.stop_reason == "eos":
            ends += 1
            assert out.token_ids[-1] == check_joinable([a, b]).end and out.pieces[-1] == "<|endoftext|>"
            assert "<" not in out.text
    assert ends > 0


# ---- sampling: the first two union tokens follow the exact joint ---------------------------------------------

N = 1000
ALPHA = 1e-3
SETTINGS = {
    "T1": {"temperature": 1.0, "top_k": 0, "top_p": 1.0},
    "k3": {"temperature": 0.7, "top_k": 3, "top_p": 1.0},
    "p07": {"temperature": 1.5, "top_k": 0, "top_p": 0.7},
}


def ref_union_probs(model, member, own: list[int], size: int, setting) -> np.ndarray:
    """A member's warped distribution over U after its own tokens ``own``: full forward, ids outside U
    excluded, warped in its own vocabulary, each token's probability added to its string's."""
    with torch.no_grad():
        logits = model(torch.tensor([own])).logits[0, -1].numpy().copy()
    index = member.index.tolist()
    logits[[i for i, u in enumerate(index) if u >= size]] = -np.inf
    p = ref_probs(logits, **setting)
    out = np.zeros(size)
    for i, u in enumerate(index):
        if u < size:
            out[u] += p[i]
    return out


def ref_target(models, union, own_prompts, context: list[int], setting, weights, threshold=None) -> np.ndarray:
    """``we`` over U; with a ``threshold``, ``gac``: the lead alone where its largest P over U reaches it."""
    each = []
    for model, member, own in zip(models, union.members, own_prompts):
        ids = own + [t for u in context for t in member.encodings[u]]
        each.append(ref_union_probs(model, member, ids, union.size, setting))
    if threshold is not None and each[0].max() >= threshold:
        return each[0]
    return sum(w * p for w, p in zip(weights, each))


def exact_joint(models, tokenizers, prompt, setting, weights, threshold=None) -> np.ndarray:
    union = check_joinable(tokenizers)
    text = tokenizers[0].decode(prompt, skip_special_tokens=True)
    own_prompts = [list(prompt)] + [list(t.encode(text)) for t in tokenizers[1:]]

    def target(context):
        return ref_target(models, union, own_prompts, context, setting, weights, threshold)

    first = target([])
    return np.stack([first[u] * target([u]) for u in range(union.size)])


def empirical_joint(models, tokenizers, prompt, method, setting, size, **kw) -> np.ndarray:
    counts = np.zeros((size, size))
    for seed in range(N):
        out = generate(models, prompt, method, max_new_tokens=2, seed=seed, tokenizers=tokenizers, **setting, **kw)
        counts[out.token_ids[0], out.token_ids[1]] += 1
    return counts


W2, W3 = [0.5, 0.5], [0.2, 0.3, 0.5]
CASES = [  # (method, members, weights, setting, generate kwargs)
    ("we", 2, W2, "T1", {}),
    ("we_sd", 2, W2, "k3", {"gamma": 2}),
    ("we_se", 2, W2, "p07", {"gamma": [1, 2]}),
    ("we_se", 2, W2, "T1", {"gamma": [2, 1], "method_args": {"first_proposer": 1, "proposer": "lookup+draft"}}),
    ("we_me", 2, W2, "k3", {}),
    ("we_me_sd", 2, W2, "T1", {"gamma": 2, "method_args": {"first_proposer": 1}}),
    ("we_se", 3, W3, "p07", {"gamma": [1, 1, 2]}),
    ("we_sd", 3, W3, "k3", {"gamma": 2, "method_args": {"first_proposer": 0, "proposer": "lookup"}}),
    ("we_me", 3, W3, "T1", {}),
    ("gac_se", 2, W2, "T1", {"gamma": [1, 2], "method_args": {"threshold": 0.75}}),
]


def union_params(cases) -> list:
    """make test runs each method's first case (two members); its others (three members, other proposers) run in
    CI, marked exhaustive."""
    seen, params = set(), []
    for c in cases:
        marks = pytest.mark.exhaustive if c[0] in seen else ()
        params.append(pytest.param(c, id=f"{c[0]}-{c[1]}-{c[3]}-{c[4].get('method_args', {})}", marks=marks))
        seen.add(c[0])
    return params


@pytest.mark.parametrize("case", union_params(CASES))
def test_first_two_union_tokens_follow_the_exact_joint(toks, hetero, case):
    method, n, weights, setting, kw = case
    models, tokenizers = hetero[:n], list(toks[:n])
    prompt = tokenizers[0].encode("ab a\nab")
    kw = {**kw, "method_args": {"weights": weights, **kw.get("method_args", {})}}
    expected = exact_joint(models, tokenizers, prompt, SETTINGS[setting], weights, kw["method_args"].get("threshold"))
    counts = empirical_joint(models, tokenizers, prompt, method, SETTINGS[setting], len(expected), **kw)
    p = chi_square_pvalue(counts, expected)
    assert p > ALPHA, f"{method}: chi-square p={p:.2e}, total variation {0.5 * np.abs(counts / N - expected).sum():.3f}"


def test_the_check_rejects_a_map_that_does_not_sum_duplicates(toks, hetero, monkeypatch):
    """A planted wrong rule: a member's duplicates overwrite each other instead of adding up."""

    def last_wins(self, member, logits):
        index, outside = member.device_maps(logits.shape[-1], self.union.size, logits.device)
        p = torch.softmax(logits.masked_fill(outside, float("-inf")) / self.warp.temperature, dim=-1)
        out = torch.zeros((p.shape[0], self.union.size + 1), dtype=p.dtype).scatter_(1, index.expand_as(p), p)
        return out[:, : self.union.size].log()

    models, tokenizers = hetero[:2], list(toks[:2])
    prompt = tokenizers[0].encode("ab a\nab")
    expected = exact_joint(models, tokenizers, prompt, SETTINGS["T1"], W2)
    monkeypatch.setattr(Joined, "to_union", last_wins)
    counts = empirical_joint(
        models, tokenizers, prompt, "we", SETTINGS["T1"], len(expected), method_args={"lambda": 0.5}
    )
    assert chi_square_pvalue(counts, expected) < ALPHA


# ---- the audit over long outputs -----------------------------------------------------------------------------

AUDITED = [
    ("we", None, "greedy"),
    ("we_sd", "draft", "greedy"),
    ("we_se", "lookup+draft", "greedy"),
    ("gac_se", "draft", "greedy"),
    ("we_sd", "lookup", "sampling"),
    ("we_se", "draft", "sampling"),
    ("we_me", None, "sampling"),
    ("we_me_sd", "draft", "sampling"),
    ("gac_sd", "lookup+draft", "sampling"),
]
SAMPLING = {"greedy": {}, "sampling": {"temperature": 0.9, "top_k": 6, "top_p": 0.95}}


def audited(toks, hetero, method, proposer, setting, n=110):
    three = not method.startswith("gac")
    models, tokenizers = (hetero, list(toks)) if three else (hetero[:2], list(toks[:2]))
    args = {"weights": [0.5, 0.3, 0.2]} if three else {"weights": [0.6, 0.4], "threshold": 0.75}
    if proposer is not None:
        args["proposer"] = proposer
    gamma = [2, 3, 1][: len(models)] if method.endswith("_se") else 3
    audit = Audit(models)
    prompt = toks[0].encode(PROMPT_TEXT)
    out = generate(
        models, prompt, method, gamma, n, method_args=args, audit=audit, tokenizers=tokenizers, **SAMPLING[setting]
    )
    return out, audit


@pytest.mark.parametrize("method,proposer,setting", AUDITED, ids=["-".join(map(str, c)) for c in AUDITED])
def test_every_union_distribution_matches_a_recompute(toks, hetero, method, proposer, setting):
    out, audit = audited(toks, hetero, method, proposer, setting)
    assert len(out.token_ids) == 110 and audit.checked >= 110
    assert audit.max_difference <= 1e-9


def crop_keeping_one_stale_token(self, length):
    """A union crop that keeps one own token too many once past union position 40."""
    if length < self.length:
        stale = 1 if length >= 40 else 0
        self.inner.crop(self.ends[length - 1] + stale)
        del self.ends[length:]
        self.length = length


def test_the_union_audit_catches_a_crop_off_by_one(toks, hetero, monkeypatch):
    monkeypatch.setattr(UnionRunner, "crop", crop_keeping_one_stale_token)
    with pytest.raises(AuditError, match="differs from a recompute from scratch"):
        audited(toks, hetero, "we_se", "draft", "sampling")


# ---- the benchmark's pieces ----------------------------------------------------------------------------------


def test_union_bench_rows_and_a_sentencepiece_twin(toks, hetero):
    from pipeline.bench.union import bench_union, render_table, sentencepiece_twin

    a = toks[0]
    twin = sentencepiece_twin(a)
    union = check_joinable([a, twin])
    assert set(union.strings) == set(check_joinable([a, a]).strings)  # the same strings, spelled otherwise
    assert twin.convert_ids_to_tokens(twin.encode("ab a")) == ["ab", "▁a"]
    rows = bench_union(hetero[:2], [a, toks[1]], ["ab a", "c"], max_new_tokens=6)
    assert [r["method"] for r in rows] == ["we", "we_sd", "we_se", "we_me"]
    assert all(r["tokens"] == 12 and r["union_size"] == 10 and 0 < r["union_map_share"] < 1 for r in rows)
    assert rows[0]["speedup"] == 1.0 and "we_se" in render_table(rows)


@pytest.mark.exhaustive  # make test: the compiled runner's own cases (test_static_runner.py)
def test_compiled_runner_members_give_the_eager_tokens(toks, hetero):
    """Union members on the static-cache runner (runs of several own tokens per union token, crops at union
    boundaries) emit the eager runner's tokens, greedy and sampled."""
    import copy

    from pipeline.decoding.runner import set_runner

    compiled = [set_runner(copy.deepcopy(m), "compiled", backend="eager") for m in hetero[:2]]
    prompt, tokenizers = toks[0].encode(PROMPT_TEXT), list(toks[:2])
    for kw in ({}, {"temperature": 1.0, "seed": 3}):
        for method, gamma in (("we", 1), ("we_se", [1, 3])):
            want = generate(hetero[:2], prompt, method, gamma, 40, tokenizers=tokenizers, **kw).token_ids
            assert generate(compiled, prompt, method, gamma, 40, tokenizers=tokenizers, **kw).token_ids == want
