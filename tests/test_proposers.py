"""The proposers that cost no forward, ``suffix`` and ``recycle``, and the job's corpus they read.

What each proposes (the suffix automaton against a brute-force search; the recycled table), that a prompt never
reads its own earlier output (the corpus's rule, the job's order, the teacher data's held-out set never read),
and that neither, nor any registered proposer, changes what a method generates: greedy identity in float64 over
every speculative method, in chains and trees, and the chi-square check of the first two tokens at T = 1, for every
kind the registrations declare (``register_proposer(test_args=)``, no list here); each check fails once proposals
are taken unverified. The ceiling (the mean of max p over the emitted positions) against an independent recompute.
"""

from __future__ import annotations

import copy
import functools
import json
import random
from collections import Counter

import numpy as np
import pytest
import torch

from pipeline.decoding import generate, loop
from pipeline.decoding.corpus import Corpus, CorpusLeak, SuffixAutomaton
from pipeline.decoding.proposers import conformance_kinds, conformance_proposers, parse_proposer
from pipeline.decoding.proposers.recycle import TokenRecycling
from pipeline.decoding.proposers.suffix import SuffixProposer
from pipeline.errors import ArgumentError

from .conftest import perturbed, tiny_llama
from .test_sampling_lossless import ALPHA, VOCAB, chi_square_pvalue, exact_joint, make_models

# ---- the suffix automaton ------------------------------------------------------------------------------------


def brute_force(documents: list[list[int]], context: list[int], longest: int = 32) -> tuple[int, Counter]:
    """The longest suffix of ``context`` (after its last negative id) found in a document with a token after it,
    and how often each token follows it: by scanning every document."""
    tail = context[-longest:]
    negative = [i for i, t in enumerate(tail) if t < 0]
    tail = tail[negative[-1] + 1 :] if negative else tail
    for n in range(len(tail), 0, -1):
        after = Counter(d[i + n] for d in documents for i in range(len(d) - n) if d[i : i + n] == tail[-n:])
        if after:
            return n, after
    return 0, Counter()


def test_the_automaton_finds_the_longest_followed_match_and_counts_what_follows():
    rng = random.Random(0)
    for _ in range(250):
        vocab = rng.choice([2, 3, 5])
        documents = [[rng.randrange(vocab) for _ in range(rng.randrange(30))] for _ in range(rng.randrange(1, 4))]
        automaton = SuffixAutomaton(documents)
        for _ in range(15):
            context = [rng.randrange(-1, vocab) for _ in range(rng.randrange(12))]
            n, after = brute_force(documents, context)
            state, length = automaton.match(context)
            assert length == n, (documents, context)
            if n:
                assert {t: c for t, c, _ in automaton.continuations(state)} == dict(after)


@pytest.mark.parametrize("eager", [False, True])
def test_the_automaton_grown_a_token_at_a_time_counts_as_the_brute_force_and_the_latest_end_too(eager):
    """Counts are made when next read (``settle``), never by walking the link chain per token: read between tokens
    of one growing text (as a generation's own text is, a round at a time), they equal the brute force's, and the
    latest end position of each continuation is where it last occurred; repetitive text included."""
    rng = random.Random(1)
    for _ in range(60):
        vocab = rng.choice([1, 2, 3])  # one token repeated is the link chain's worst case
        text = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        automaton = SuffixAutomaton(eager=eager)
        for i, t in enumerate(text):
            automaton.extend(t)
            context = text[max(0, i - rng.randrange(1, 6)) : i + 1]
            n, after = brute_force([text[: i + 1]], context)
            state, length = automaton.match(context)
            assert length == n
            found = automaton.continuations(state) if n else []
            assert {t: c for t, c, _ in found} == dict(after)
            for token, _, latest in found:  # the last place the match was followed by token, ending there
                ends = [j + n for j in range(i + 1 - n) if text[j : j + n] == context[-n:] and text[j + n] == token]
                assert latest == max(ends)


def test_a_document_of_one_token_repeated_100000_times_builds_in_linear_time():
    """The suffix corpus of teacher data holding one token 100,000 times (or a model's looping output): walking the
    link chain per token took 3.2 s at 10,000 tokens and grows with the square; counting once is linear (0.2 s
    here at 100,000; ``python -m pipeline.bench.automaton`` prints the figures). A hang guard, not a timing."""
    import signal

    def hang(*_):
        raise TimeoutError("building the automaton of 100,000 repeated tokens did not finish in 60 s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    try:
        automaton = SuffixAutomaton([[7] * 100_000])
        state, length = automaton.match([7] * 40)
        assert length == 32 and automaton.continuations(state) == [(7, 100_000 - 32, 99_999)]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_the_automaton_benchmark_prints_its_table(capsys):
    from pipeline.bench.automaton import main

    assert main(["--tokens", "500"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| one") or "random" in line]
    assert len(rows) == 2 and all(" 500 |" in row for row in rows)


def test_the_automaton_never_matches_across_documents_nor_proposes_a_separator():
    automaton = SuffixAutomaton([[1, 2], [3, 4]])
    state, length = automaton.match([2, 3])  # "2 3" only spans the two documents
    assert length == 1 and [t for t, _, _ in automaton.continuations(state)] == [4]
    state, length = automaton.match([1, 2])  # "1 2" ends a document: followed by nothing but a separator
    assert length == 0


def outputs(*documents: list[int]) -> Corpus:
    """A corpus whose documents are done prompts' outputs."""
    corpus = Corpus()
    for i, doc in enumerate(documents):
        corpus.add_output(f"done-{i}", doc)
    return corpus


def test_suffix_proposes_the_most_frequent_continuation_of_the_longer_match():
    corpus = outputs([7, 8, 9, 1], [7, 8, 9, 1], [7, 8, 9, 1], [7, 8, 9, 2], [5, 6, 3])
    proposer = SuffixProposer(corpus.view("p"))
    context = [0, 7, 8, 9]
    proposer.feed(context, len(context))
    assert proposer.continuations(context, 3) == [1, 2]  # 1 follows "7 8 9" three times of four, 2 once
    strict = SuffixProposer(corpus.view("p"), min_share=0.8)  # 3 of 4 is too few: the match proposes nothing
    assert strict.continuations(context, 3) == []
    # the longer match wins; on a tie of lengths, the context's own text
    context = [9, 2, 3, 4, 0, 2, 3, 4]  # its own text: "2 3 4" was followed by 0
    for documents, expected in (([7, 0, 2, 3, 4, 5],), [5, 0]), (([8, 2, 3, 4, 5],), [0, 5]):
        proposer = SuffixProposer(outputs(*documents).view("p"))
        proposer.feed(context, len(context))
        assert proposer.continuations(context, 2) == expected
    # the fixed documents (text of another kind) propose from long matches only
    fixed = Corpus([[1, 2, 3, 4, 5, 6, 7, 8], [3, 4, 5, 9]])
    assert SuffixProposer(fixed.view("p")).continuations([0, 4, 5], 1) == []
    assert SuffixProposer(fixed.view("p")).continuations([1, 2, 3, 4, 5, 6], 1) == [7]
    lone = SuffixProposer(None)
    lone.feed([1, 2, 3, 1, 2], 5)
    assert lone.continuations([1, 2, 3, 1, 2], 2) == [3] and lone.continuations([9, 9], 1) == []
    with pytest.raises(ArgumentError, match="suffix min_match=0"):
        SuffixProposer(None, min_match=0)


def test_suffix_learns_only_final_tokens_and_matches_the_pending_ones():
    proposer = SuffixProposer(None)
    tokens = [1, 2, 3, 4, 1, 2]
    proposer.feed(tokens, 4)  # [1, 2, 3, 4] are final; "1 2" pending
    assert proposer.own.size == 4
    assert proposer.continuations(tokens, 1) == [3]


def test_recycling_proposes_the_targets_top_tokens_after_the_last_token():
    rows = torch.tensor([[0.1, 0.5, 0.25, 0.15], [0.7, 0.1, 0.15, 0.05]])
    recycling = TokenRecycling(None, top=3)
    recycling.observe([2, 3], rows)
    assert recycling.continuations([0, 2], 2) == [1, 2] and recycling.continuations([3], 1) == [0]
    assert recycling.continuations([1], 2) == [] and recycling.draft([9, 2], 2).token == 1
    recycling.observe([2], rows[1:])  # the latest verified position after a token replaces its candidates
    assert recycling.continuations([2], 1) == [0]


# ---- the corpus: a prompt never reads its own earlier output ------------------------------------------------------


def test_a_prompts_view_is_refused_once_its_output_is_in_the_corpus():
    corpus = Corpus([[1, 2, 3]])
    early = corpus.view("a")
    corpus.add_output("b", [4, 5, 6])
    assert [kind for kind, _ in early.automata()] == ["outputs", "fixed"]  # b's output is read by a's view now
    corpus.add_output("a", [7, 8, 9])
    with pytest.raises(CorpusLeak, match="prompt 'a'"):
        corpus.view("a")
    with pytest.raises(CorpusLeak, match="while its view was in use"):
        early.automata()


def test_recycled_tables_reach_other_prompts_only_once_their_prompt_is_done():
    corpus = Corpus()
    view = corpus.view("a")
    view.leave({1: [2, 3]})
    assert corpus.view("b").table() == {}  # a is not done: its table is nobody's yet
    corpus.add_output("a", [1, 2])
    assert corpus.view("b").table() == {1: [2, 3]}


def test_the_teacher_datas_held_out_continuations_never_enter_the_corpus(tiny_dir, tmp_path, monkeypatch):
    from pipeline.models import corpus as model_corpus
    from pipeline.models.spec import ModelSpec

    monkeypatch.setenv("SPECENS_CACHE", str(tmp_path))
    target = ModelSpec("t", source=str(tiny_dir))
    draft = ModelSpec("d", distill={"teacher": {"name": "t", "source": str(tiny_dir)}, "layers": 1})
    files = model_corpus.teacher_data_files([target, draft])
    assert files == []
    docs, why = model_corpus.teacher_documents([target, draft], 32)
    assert docs == [] and "no teacher data of t" in why
    from pipeline.models.recipe import Recipe
    from pipeline.models.teacher import data_name

    store = tmp_path / "teacher-data" / data_name(model_corpus.teacher_spec(draft), Recipe(layers=1))
    store.parent.mkdir()
    held_out = [990, 991, 992, 993]  # a benchmark prompt's own continuation: must never be read
    example = (torch.tensor([[5, 6, 7, 8]]), torch.tensor([-100, 1, 2, 3]), torch.tensor([1, 2, 3]), torch.zeros(3, 2))
    torch.save({"examples": [example], "held": [([1, 2], held_out, torch.zeros(4, 2))], "kept": [0, 1]}, store)
    docs, why = model_corpus.teacher_documents([target, draft], 32)
    assert docs == [[5, 6, 7, 8]] and "1 sequences" in why
    assert not any(t in doc for doc in docs for t in held_out)
    docs, why = model_corpus.teacher_documents([target, draft], 8)  # ids of another vocabulary: a proposal outside
    assert docs == [] and "example 0's ids holds ids outside the vocabulary of 8" in why  # the target's is refused
    for content in ({"foo": 1}, {"examples": [(torch.tensor([[0.5, 2.0]]),)]}, [1, 2]):
        torch.save(content, store)
        docs, why = model_corpus.teacher_documents([target, draft], 32)
        assert docs == [] and "cannot be read" in why, content
    store.write_bytes(b"not a torch file")
    docs, why = model_corpus.teacher_documents([target, draft], 32)
    assert docs == [] and "cannot be read" in why


def test_a_job_reads_the_outputs_of_earlier_prompts_never_its_own(tiny_dir, tmp_path, monkeypatch):
    """The generation job: each prompt's view is made before its output joins, the outputs join in the task's
    order (a resume rebuilds the same corpus from the journal), and the meta file says what the corpus held."""
    from pipeline.decoding import corpus as corpus_module
    from pipeline.experiment.cell import Cell
    from pipeline.job.generate import run_cell
    from pipeline.models import ModelSpec

    seen: list[tuple[str, frozenset]] = []
    view = corpus_module.Corpus.view

    def spy(self, prompt_id):
        seen.append((prompt_id, frozenset(self.done)))
        return view(self, prompt_id)

    monkeypatch.setattr(corpus_module.Corpus, "view", spy)
    cell = Cell(
        models=[ModelSpec("a", str(tiny_dir))],
        method="sd",
        task="humaneval",
        gamma=3,
        method_args={"proposer": "suffix+recycle"},
        size=3,
        max_new_tokens=8,
        baseline="large_model",
    )
    out = tmp_path / "cell.jsonl"
    run_cell(cell, out, progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert [p for p, _ in seen] == ids  # one view per prompt (and per attempt), in the task's order
    for k, (prompt, done) in enumerate(seen):
        assert prompt not in done and done == frozenset(ids[:k])
    assert all(r["output"] == r["baseline"]["output"] for r in rows)
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["corpus"]["outputs"] == 0 and "no teacher data" in meta["corpus"]["source"]
    stats = rows[-1]["stats"]["proposers"]
    assert set(stats) == {"suffix", "recycle"} and stats["recycle"]["propose_time_s"] > 0


# ---- exactness: greedy identity and the chi-square check, failing when proposals go unverified --------------------


@pytest.fixture(scope="module")
def trio():
    target = tiny_llama(80, vocab=24, layers=2, hidden=32)
    return [target, perturbed(target, 0.1, seed=81), tiny_llama(82, vocab=24)]


@functools.cache
def headed(models: tuple) -> list:
    """The models, the first a copy with a random feature head attached (what a kind that reads the target's
    features needs, ``reads_features``: ``eagle``'s head; peaked, so it proposes, sometimes rightly)."""
    from pipeline.decoding.proposers.feature import attach
    from pipeline.models.feature_head import FeatureHead

    target = copy.deepcopy(models[0])
    torch.manual_seed(0)
    head = FeatureHead(target, None)
    with torch.no_grad():
        head.fc.weight.mul_(4)
    return [attach(target, head), *models[1:]]


def models_for(models: list, kind: str) -> list:
    """The models a case of ``kind`` runs on: with a feature head on the first where a part of it reads one."""
    return headed(tuple(models)) if parse_proposer(kind).reads_features else list(models)


PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4], [2, 2, 5, 2, 2, 5, 2]]
# every registered proposer's kinds, as each declared them (``register_proposer(test_args=)``): alone, chained and
# before the draft model; registering one puts it under these suites and the tree suite, no test edited
REGISTERED = conformance_kinds()
KIND_ARGS = {k.kind: dict(k.method_args) for k in REGISTERED}
KINDS = [k.kind for k in REGISTERED if k.role != "chain"]  # suffix, recycle, suffix+recycle+draft, lookup, eagle...
# each kind in a chain, and in the trees where every part branches (a proposer that cannot is refused by a tree)
SHAPES = [(k, tree) for k in KINDS for tree in (None, "3x2", "d6") if tree is None or parse_proposer(k).branches]
METHODS = [("sd", 2, {}), ("we_sd", 3, {"weights": [0.5, 0.3, 0.2]}), ("we_se", 3, {"weights": [0.5, 0.3, 0.2]})]
METHODS += [("cd_sd", 2, {"alpha": 0.3}), ("cd_se", 2, {"alpha": 0.3})]


def corpus_for(trio_models, prompt: list[int], base: str, args: dict) -> Corpus:
    """A corpus whose documents hold the baseline's own continuation of a shifted prompt (right guesses) and
    random text (wrong ones), and a warm recycled table of arbitrary candidates."""
    rng = random.Random(len(prompt))
    other = [(t + 1) % 24 for t in prompt]
    right = generate(trio_models, other, base, max_new_tokens=20, method_args=args).token_ids
    corpus = Corpus([other + right, [rng.randrange(24) for _ in range(60)]])
    corpus.table = {t: [(t * 7 + j) % 24 for j in range(4)] for t in range(24)}
    return corpus


@pytest.mark.spread("tree")  # make test: each method and kind with one shape (a chain or a tree), in turn
@pytest.mark.parametrize("kind,tree", SHAPES, ids=[f"{k}-{t}" for k, t in SHAPES])
@pytest.mark.parametrize("method,n,args", METHODS, ids=[m for m, _, _ in METHODS])
def test_greedy_outputs_equal_the_standard_methods(trio, method, n, args, kind, tree):
    models = models_for(trio, kind)[:n]
    base = "large_model" if method == "sd" else method.split("_")[0]
    named = parse_proposer(kind).named
    proposed = 0
    for prompt in PROMPTS:
        ref = generate(models, prompt, base, max_new_tokens=30, method_args=args).token_ids
        corpus = corpus_for(models, prompt, base, args)
        gamma = [2] * n if method.endswith("_se") else 3
        out = generate(
            models,
            prompt,
            method,
            gamma,
            30,
            method_args={**args, **KIND_ARGS[kind], "proposer": kind},
            corpus=corpus.view("p"),
            **({"tree": tree} if tree else {}),
        )
        assert out.token_ids == ref, (prompt, kind, tree)
        proposed += sum(out.stats.proposers[name].accepted for name in named)
    assert proposed > 0  # its proposals were used, and accepted where right


def accept_everything(target, proposed):
    return len(proposed), None


def test_greedy_identity_fails_once_proposals_go_unverified(trio, monkeypatch):
    models = trio[:2]
    ref = generate(models, PROMPTS[0], "large_model", max_new_tokens=30).token_ids
    monkeypatch.setattr(loop, "verify_greedy", accept_everything)
    for kind in ("suffix", "recycle"):
        corpus = corpus_for(models, PROMPTS[0], "large_model", {})
        out = generate(models, PROMPTS[0], "sd", 3, 30, method_args={"proposer": kind}, corpus=corpus.view("p"))
        assert out.token_ids != ref, kind


@pytest.fixture(scope="module")
def small():
    return make_models()


T1 = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
REPEAT = [1, 4, 2, 1, 4]  # the context's own text: "1 4" was followed by 2
SEEDS = 1000


def small_corpus() -> Corpus:
    corpus = outputs([1, 4, 3, 3, 5], [2, 0, 1, 1, 4, 0])  # "1 4" -> 3 and 0 here, 2 in the prompt: often wrong
    corpus.table = {t: [(t + 1) % VOCAB, (t + 3) % VOCAB, t] for t in range(VOCAB)}
    return corpus


def joint(models, method, prompt, seeds=SEEDS, **kw) -> np.ndarray:
    """The first two tokens' counts over ``seeds`` runs; the named proposers' proposals must have been verified
    and some accepted (else the check would say nothing of them)."""
    counts = np.zeros((VOCAB, VOCAB))
    named = parse_proposer(kw["method_args"]["proposer"]).named
    accepted = Counter()
    kw = {"max_new_tokens": 2, **kw}
    for seed in range(seeds):
        corpus = small_corpus()
        out = generate(models, prompt, method, seed=seed, corpus=corpus.view("p"), **T1, **kw)
        counts[out.token_ids[0], out.token_ids[1]] += 1
        accepted.update({n: out.stats.proposers[n].accepted for n in named})
    assert all(accepted[n] > 0 for n in named), accepted
    return counts


def sampled(registered) -> list[tuple]:
    """The chi-square cases of the registered proposers' kinds (``conformance_kinds``): each proposer alone in
    ``sd``, and in a tree there where it branches and declares no chain; its chain (``suffix+recycle``) in
    ``cd_sd``, in a tree where every part branches; before the draft model in ``we_se``. Each checks the first two
    tokens, and that the kind's proposals were verified and some accepted (``joint``)."""
    cases = []
    tests = conformance_proposers()
    for k in registered:
        args, branches = dict(k.method_args), parse_proposer(k.kind).branches
        if k.role == "alone":
            cases.append(("sd", [0], "single", {}, {"gamma": 2, "method_args": {**args, "proposer": k.kind}}))
            if branches and not tests[k.kind].chain:  # one with a chain has its tree in its chain's case
                kw = {"gamma": 2, "method_args": {**args, "proposer": k.kind}, "tree": "3x1"}
                if parse_proposer(k.kind).reads_features:  # a head drafts from the target's features: a tree's
                    kw["max_new_tokens"] = 3  # first round has none yet, its second drafts the second token
                cases.append(("sd", [0, 1], "single", {}, kw))
        elif k.role == "chain":
            kw = {"gamma": 2, "method_args": {"alpha": 0.3, **args, "proposer": k.kind}}
            cases.append(("cd_sd", [0, 1], "cd", {"alpha": 0.3}, {**kw, **({"tree": "2x2"} if branches else {})}))
        else:
            kw = {"gamma": [1, 2], "method_args": {"lambda": 0.5, **args, "proposer": k.kind}}
            cases.append(("we_se", [0, 1], "we", {"weights": [0.5, 0.5]}, kw))
    return cases


# (method, models, reference, its args, generate's kwargs): sd-suffix, sd-recycle, sd-recycle-3x1,
# we_se-suffix+recycle+draft, cd_sd-suffix+recycle-2x2, and as many for every other registered proposer
SAMPLED = sampled(REGISTERED)


@pytest.mark.parametrize("case", SAMPLED, ids=lambda c: f"{c[0]}-{c[4]['method_args']['proposer']}-{c[4].get('tree')}")
def test_the_first_two_tokens_follow_the_target(small, case):
    method, idx, kind, ref_args, kw = case
    chosen = [models_for(small, kw["method_args"]["proposer"])[i] for i in idx]
    expected = exact_joint(kind, chosen, T1, ref_args, REPEAT)
    p = chi_square_pvalue(joint(chosen, method, REPEAT, **kw), expected)
    assert p > ALPHA, f"{method}: chi-square p={p:.2e}"


def test_the_check_fails_once_one_hot_proposals_go_unverified(small, monkeypatch):
    """Proposals of ``suffix``, of ``recycle``, accepted as they are (no test against the target) fail the check."""

    def accept_all(target, proposed, draft, generator):
        return len(proposed), None

    monkeypatch.setattr(loop, "verify_sampled", accept_all)
    expected = exact_joint("single", small[:1], T1, {}, REPEAT)
    for kind in ("suffix", "recycle"):
        counts = joint(small[:1], "sd", REPEAT, seeds=400, gamma=2, method_args={"proposer": kind})
        assert chi_square_pvalue(counts, expected) < ALPHA, kind


# ---- the ceiling: the mean of max p over the emitted positions ------------------------------------------------


def test_the_ceiling_is_the_mean_of_the_targets_largest_probability_over_the_output(small):
    """Recorded by every method (the large model's own decoding too: the same target); 1 when greedy."""
    models = small[:2]
    for method, kw in (("sd", {"gamma": 2}), ("sd", {"gamma": 2, "tree": "2x1"}), ("large_model", {})):
        out = generate(models, [1, 4, 2], method, max_new_tokens=12, seed=3, temperature=0.8, **kw)
        tokens = [1, 4, 2, *out.token_ids]
        with torch.no_grad():
            logits = models[0](torch.tensor([tokens])).logits[0, 2:-1].double()
        expected = torch.softmax(logits / 0.8, -1).amax(-1).mean().item()
        assert out.stats.ceiling_positions == len(out.token_ids)
        assert out.stats.ceiling == pytest.approx(expected, abs=1e-9)
    greedy = generate(models, [1, 4, 2], "sd", 2, 8)  # the target one-hot at its argmax: accepted always
    assert greedy.stats.ceiling == 1.0 and greedy.stats.to_dict()["ceiling"] == 1.0


# ---- the proposer syntax ------------------------------------------------------------------------------------


def test_proposer_values_are_parsed_once_and_refused_in_one_line():
    assert parse_proposer("suffix+recycle+draft").named == ("suffix", "recycle")
    assert parse_proposer("draft").draft and not parse_proposer("suffix").draft
    for bad in ("", "draft+suffix", "suffix+suffix", "sufix", 3, "suffix+"):
        with pytest.raises(ArgumentError, match="proposer="):
            parse_proposer(bad)
    with pytest.raises(ArgumentError, match="unknown proposer 'sufix'"):
        generate([tiny_llama(1)], [1, 2], "sd", 2, 4, method_args={"proposer": "sufix"})
    with pytest.raises(ArgumentError, match=r"corpus=Corpus: expected one prompt's view"):
        generate([tiny_llama(1)], [1, 2], "sd", 2, 4, method_args={"proposer": "suffix"}, corpus=Corpus())


def test_a_registration_declares_the_suites_cases_of_its_proposer():
    """``register_proposer(test_args=)`` is what the suites read (``conformance_kinds``): a proposer registered with
    none is under them alone and before the draft, no arguments; one with ``ProposerTests`` (or a dict of its fields)
    as it declared, its ``method_args`` in each case; ``suffix``'s chain holds ``recycle+draft``; ``test_args=None``
    leaves it out; a chain naming a proposer not under the suites, a field it does not have, one refused."""
    from pipeline.decoding.proposers import NAMED_PROPOSERS, PROPOSER_TESTS, ProposerTests, register_proposer

    def kinds():
        return {(k.role, k.kind): k.method_args for k in conformance_kinds()}

    built_in = kinds()
    assert {("alone", "suffix"), ("chain", "suffix+recycle"), ("draft", "suffix+recycle+draft")} <= set(built_in)
    assert ("draft", "recycle+draft") not in built_in and ("alone", "recycle") in built_in
    names = ("plain", "reaching", "hidden", "dangling")
    try:
        register_proposer("plain")(OneAtATime)
        register_proposer("reaching", test_args={"method_args": {"least_reach": 0.2}, "alone": False})(OneAtATime)
        register_proposer("hidden", test_args=None)(OneAtATime)
        found = kinds()
        assert found[("alone", "plain")] == {} and found[("draft", "plain+draft")] == {}
        assert found[("draft", "reaching+draft")] == {"least_reach": 0.2} and ("alone", "reaching") not in found
        assert not any("hidden" in kind for _, kind in found)
        register_proposer("dangling", test_args=ProposerTests(chain=("nowhere",)))(OneAtATime)
        with pytest.raises(ArgumentError, match="'dangling': test_args chain names 'nowhere'"):
            conformance_kinds()
    finally:
        for name in names:
            NAMED_PROPOSERS.pop(name, None)
            PROPOSER_TESTS.pop(name, None)
    for bad in ({"shape": 1}, ProposerTests, {"alone": False, "draft": False}, {"method_args": {"proposer": "x"}}):
        with pytest.raises(ArgumentError, match="test_args"):
            register_proposer("bad", test_args=bad)
    assert "bad" not in NAMED_PROPOSERS


class OneAtATime:
    """A proposer written to the protocol alone, with one candidate per position: it cannot branch."""

    def __init__(self):
        from pipeline.decoding.stats import ModelStats

        self.stats = ModelStats()

    def feed(self, tokens, committed):
        pass

    def draft(self, tokens, committed):
        return None


def test_a_tree_with_a_proposer_that_cannot_branch_is_refused_when_the_config_is_read():
    from pipeline import ROOT
    from pipeline.decoding.proposers import NAMED_PROPOSERS, register_proposer
    from pipeline.experiment.config import ConfigError, check_config
    from pipeline.experiment.config_file import load_config_file

    config = load_config_file(ROOT / "config" / "default.yaml")
    sd = next(g for g in config["grids"] if g["name"] == "sd")
    config["grids"].append({**sd, "name": "trees", "tree": ["2x1"], "datasets": {"humaneval": {"size": 2}}})
    trees = len(config["grids"]) - 1
    register_proposer("one_at_a_time")(OneAtATime)
    try:
        config["grids"][trees]["proposer"] = "suffix+one_at_a_time+draft"
        with pytest.raises(ConfigError, match=rf"grids\[{trees}\].tree: \"2x1\" with proposer 'one_at_a_time'"):
            check_config(config)
        config["grids"][trees]["proposer"] = "suffix+recycle+draft"  # both branch: accepted
        assert check_config(config)["grids"][trees]["proposer"] == "suffix+recycle+draft"
    finally:
        NAMED_PROPOSERS.pop("one_at_a_time")


DROPPED = '''
from pipeline.decoding.proposers import NamedProposer, Proposal, register_proposer
from pipeline.decoding.stats import ModelStats


@register_proposer("repeat_last")
class RepeatLast(NamedProposer):
    """Proposes the context's last token again (one-hot): a module dropped in the proposers' folder."""

    branches = True

    def __init__(self):
        self.stats = ModelStats()

    def draft(self, tokens, committed):
        return Proposal(tokens[-1], None, self)

    def continuations(self, context, limit):
        return [context[-1]][:limit]
'''


def test_a_module_dropped_in_the_proposers_folder_is_a_proposer_kind_with_no_import_line(tmp_path):
    """``discover`` imports every module of the folder (``pkgutil`` over its ``__path__``): one placed there, here
    a folder appended to the package's path as a file copied into ``pipeline/decoding/proposers/`` would be, is a
    proposer kind of ``generate``, of the method check and of a config's tree check, in a fresh process, with no
    line edited anywhere else. Without the discovery it is unknown, one line."""
    (tmp_path / "repeat_last.py").write_text(DROPPED)
    script = f"""
import pipeline.decoding.proposers as proposers
from pipeline.decoding.spec import parse_method
from pipeline.errors import ArgumentError
try:
    parse_method("sd").check(2, {{"proposer": "repeat_last+draft"}})
except ArgumentError as err:
    print("before:", err)
proposers.__path__.append({str(tmp_path)!r})
print("modules:", ",".join(proposers.discover()))
print("resolved:", parse_method("sd").check(2, {{"proposer": "repeat_last+draft"}})["proposer"])
print("branches:", proposers.parse_proposer("repeat_last+lookup").branches)
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "before: proposer='repeat_last+draft': unknown proposer 'repeat_last'" in out
    assert "modules: feature,lookup,recycle,suffix,repeat_last" in out
    assert "resolved: repeat_last+draft" in out and "branches: True" in out


def test_a_proposer_that_reads_features_needs_a_head_on_the_first_model_when_the_config_is_read():
    """``reads_features`` is a declaration, read by the config check for any proposer that makes it (the built-in
    ``eagle`` declares it), not a comparison with a name: a throwaway proposer that declares it is refused on a
    set whose first model has no feature head, in one line naming it; one that does not is accepted."""
    from pipeline import ROOT
    from pipeline.decoding.proposers import NAMED_PROPOSERS, NamedProposer, capabilities, register_proposer
    from pipeline.experiment.config import ConfigError, check_config
    from pipeline.experiment.config_file import load_config_file

    class ReadsNothing(NamedProposer):
        def draft(self, tokens, committed):
            return None

    class ReadsFeatures(ReadsNothing):
        reads_features = True

    assert capabilities(NAMED_PROPOSERS["eagle"]).reads_features
    assert not any(capabilities(NAMED_PROPOSERS[n]).reads_features for n in ("lookup", "suffix", "recycle"))
    config = load_config_file(ROOT / "config" / "default.yaml")
    register_proposer("reads_features")(ReadsFeatures)
    register_proposer("reads_nothing")(ReadsNothing)
    try:
        config["grids"][0]["proposer"] = "lookup+reads_features+draft"
        with pytest.raises(ConfigError, match=r"grids\[0\].proposer: reads_features drafts from a feature head"):
            check_config(config)
        config["grids"][0]["proposer"] = "lookup+reads_nothing+draft"
        assert check_config(config)["grids"][0]["proposer"] == "lookup+reads_nothing+draft"
    finally:
        NAMED_PROPOSERS.pop("reads_features")
        NAMED_PROPOSERS.pop("reads_nothing")


# ---- how far a chain drafts: the reach of its proposals ------------------------------------------------------------


def scripted(confidences: list[float]) -> type:
    """A proposer that proposes the context's last token with the given confidences, one per pending token."""
    from pipeline.decoding.proposers import NamedProposer, Proposal
    from pipeline.decoding.stats import ModelStats

    class Scripted(NamedProposer):
        def __init__(self):
            self.stats = ModelStats()

        def draft(self, tokens, committed):
            k = len(tokens) - committed
            return Proposal(tokens[-1], None, self, confidence=confidences[min(k, len(confidences) - 1)])

    return Scripted


@pytest.mark.parametrize("least_reach,per_round", [(0.0, 5), (0.3, 2), (0.95, 0)])
def test_a_chain_stops_before_the_proposal_whose_reach_falls_below_the_methods_least_reach(
    trio, monkeypatch, least_reach, per_round
):
    """Confidences 0.9, 0.5, 0.5, ...: reaches 0.9, 0.45, 0.225; at least 0.3 a round drafts 2 of its gamma 5, at
    0.95 none (the bonus token alone), at 0 all 5. The output is the large model's at every setting."""
    from pipeline.decoding.proposers import NAMED_PROPOSERS

    monkeypatch.setitem(NAMED_PROPOSERS, "scripted", scripted([0.9, 0.5]))
    counts, settle = [], loop.Decoder._settle

    def spy(self, start, count, target):
        counts.append(count)
        return settle(self, start, count, target)

    monkeypatch.setattr(loop.Decoder, "_settle", spy)
    prompt = PROMPTS[0]
    base = generate(trio[:1], prompt, "large_model", max_new_tokens=12)
    args = {"proposer": "scripted", "least_reach": least_reach}
    out = generate(trio[:1], prompt, "sd", gamma=5, max_new_tokens=12, method_args=args)
    assert out.token_ids == base.token_ids and out.method_args["least_reach"] == least_reach
    assert counts[:1] == [per_round][: len(counts)] and max(counts, default=0) == per_round  # the first round's full
    assert out.stats.proposers["scripted"].proposed == sum(counts)


@pytest.mark.parametrize("proposer,idx", [("suffix+recycle", [0]), ("suffix+recycle+draft", [0, 1]), ("draft", [0, 2])])
def test_the_reach_rule_keeps_sampling_exact(small, proposer, idx):
    """At T = 1 a chain cut by its reach (suffix's shares, recycle's recorded probabilities, a sampled draft's
    largest probability) still samples the target: the chi-square check of the first two tokens."""
    kw = {"gamma": 3, "method_args": {"proposer": proposer, "least_reach": 0.3}}
    expected = exact_joint("single", [small[0]], T1, {}, REPEAT)
    p = chi_square_pvalue(joint([small[i] for i in idx], "sd", REPEAT, **kw), expected)
    assert p > ALPHA, f"chi-square p={p:.2e}"


def test_the_check_fails_once_a_sampled_drafts_reach_reads_the_token_it_drew(small, monkeypatch):
    """The reason a sampled draft's confidence is its distribution's largest probability: were it the probability
    of the token drawn, whether a position is drafted would depend on what was drawn there (the rarer tokens never
    drafted), the drafted token would no longer follow q, and the output would leave the target; the chi-square
    check sees it."""
    from pipeline.decoding.proposers.base import ModelProposer

    draft = ModelProposer.draft

    def by_drawn_token(self, tokens, committed):
        proposal = draft(self, tokens, committed)
        proposal.confidence = float(proposal.q[proposal.token])
        return proposal

    monkeypatch.setattr(ModelProposer, "draft", by_drawn_token)
    models = [small[0], small[2]]  # a draft far from the target: the bias is large
    counts = np.zeros((VOCAB, VOCAB))
    for seed in range(SEEDS):
        args = {"least_reach": 0.3}
        out = generate(models, REPEAT, "sd", gamma=3, max_new_tokens=2, seed=seed, method_args=args, **T1)
        counts[out.token_ids[0], out.token_ids[1]] += 1
    p = chi_square_pvalue(counts, exact_joint("single", [small[0]], T1, {}, REPEAT))
    assert p < ALPHA, f"chi-square p={p:.2e}: the biased rule went unseen"


def test_suffix_and_recycling_say_how_sure_each_proposal_is():
    """``suffix``: the share of its match's continuations the proposed token holds; ``recycle``: the target's
    probability of it where this generation last saw the token before it (none for a row an earlier prompt left)."""
    corpus = outputs([7, 8, 9, 1], [7, 8, 9, 1], [7, 8, 9, 1], [7, 8, 9, 2])
    proposer = SuffixProposer(corpus.view("p"), min_share=0.5)
    proposal = proposer.draft([0, 7, 8, 9], 4)
    assert proposal.token == 1 and proposal.confidence == pytest.approx(0.75)
    assert proposer.ranked([0, 7, 8, 9]) == [(1, 0.75), (2, 0.25)]
    rows = torch.tensor([[0.1, 0.5, 0.25, 0.15]])
    corpus = Corpus()
    corpus.table = {3: [2, 1]}
    recycling = TokenRecycling(corpus.view("p"), top=3)
    assert recycling.draft([3], 1).token == 2 and recycling.draft([3], 1).confidence is None
    recycling.observe([3], rows)
    assert recycling.draft([3], 1).token == 1 and recycling.draft([3], 1).confidence == pytest.approx(0.5)


def test_a_greedy_targets_rows_reach_recycling_as_probabilities(trio):
    """At T = 0 the decoder hands the watchers the target's softmax (its logits made probabilities), so a recycled
    confidence is a probability there too."""
    from pipeline.decoding.proposers import NAMED_PROPOSERS

    seen = []

    class Spy(TokenRecycling):
        def observe(self, before, rows):
            seen.append(rows)
            super().observe(before, rows)

    NAMED_PROPOSERS["spy_recycle"] = Spy
    try:
        generate(trio[:1], PROMPTS[0], "sd", gamma=3, max_new_tokens=8, method_args={"proposer": "spy_recycle"})
    finally:
        NAMED_PROPOSERS.pop("spy_recycle")
    assert seen and all(torch.allclose(r.sum(-1), torch.ones_like(r[:, 0])) and (r >= 0).all() for r in seen)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.3", True, None])
def test_a_least_reach_outside_0_to_1_is_one_line_naming_it(trio, bad):
    with pytest.raises(ArgumentError, match=r"least_reach=.* for 'sd': expected a number in 0\.\.1"):
        generate(trio[:1], PROMPTS[0], "sd", method_args={"proposer": "suffix", "least_reach": bad})


@pytest.mark.parametrize("mutant", ["accepted unverified", "no residual"])
def test_the_check_fails_once_a_trees_one_hot_candidates_skip_the_multi_candidate_rule(small, monkeypatch, mutant):
    """Several one-hot candidates at a node (suffix's ranked continuations, recycle's table) are kept with the sum of
    their probabilities only through the rule: each tested against the residual the ones before it left. A tree
    whose candidates are taken unverified, or tested against the target's row itself instead of the residual (the
    second candidate under-accepted), fails the chi-square check that the rule as written passes (``SAMPLED``)."""
    import pipeline.decoding.tree.verify as tree_verify

    if mutant == "accepted unverified":
        monkeypatch.setattr(tree_verify, "accept_one", lambda target, q, token, generator: True)
    else:
        monkeypatch.setattr(tree_verify, "residual", lambda target, q, token: target.clone())
    expected = exact_joint("single", small[:1], T1, {}, REPEAT)
    counts = np.zeros((VOCAB, VOCAB))
    for seed in range(600):
        args = {"proposer": "suffix+recycle"}
        out = generate(
            small[:1],
            REPEAT,
            "sd",
            gamma=2,
            max_new_tokens=2,
            seed=seed,
            tree="3x1",
            method_args=args,
            corpus=small_corpus().view("p"),
            **T1,
        )
        counts[out.token_ids[0], out.token_ids[1]] += 1
    assert chi_square_pvalue(counts, expected) < ALPHA, mutant
