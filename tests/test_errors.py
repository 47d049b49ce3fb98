"""Every bad input is refused with one clear ValueError before any decoding."""

from __future__ import annotations

import pytest

from pipeline.decoding import generate

from .conftest import tiny_llama

PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def models():
    return [tiny_llama(50), tiny_llama(51), tiny_llama(52)]


@pytest.fixture()
def counted(models):
    """Count forward calls, to prove nothing was decoded before the error."""
    calls = []
    handles = [m.register_forward_hook(lambda *a: calls.append(1)) for m in models]
    yield calls
    for h in handles:
        h.remove()


CASES = [
    # (kwargs, index of models used, words the message must contain)
    ({"method": "beam_search"}, 2, ["unknown method 'beam_search'", "we_se"]),
    ({"method": "sd", "gamma": 0}, 2, ["gamma=0", ">= 1"]),
    ({"method": "we_se", "gamma": -2}, 2, ["gamma=-2"]),
    ({"method": "we_se", "gamma": [1, 2, 3]}, 2, ["gamma=[1, 2, 3]", "expected 2 ints"]),
    ({"method": "we_se", "gamma": [1, 0]}, 2, ["gamma=[1, 0]"]),
    ({"method": "sd", "gamma": [1, 2]}, 2, ["a list is for *_se methods"]),
    ({"method": "we_sd", "gamma": 2.5}, 2, ["gamma=2.5"]),
    ({"method": "we", "method_args": {"lambda": 1.5}}, 2, ["lambda=1.5", "[0, 1]"]),
    ({"method": "we_se", "method_args": {"lambda": -0.1}}, 2, ["lambda=-0.1"]),
    ({"method": "we", "method_args": {"lambda": 0.5}}, 3, ["'lambda' needs exactly 2 models"]),
    ({"method": "we", "method_args": {"weights": [1, 2]}}, 3, ["expected 3 non-negative numbers"]),
    ({"method": "cd", "method_args": {"lambda": 0.5}}, 2, ["unknown method_args ['lambda']", "alpha, beta"]),
    ({"method": "cd", "method_args": {"alpha": -1}}, 2, ["alpha=-1"]),
    ({"method": "cd", "method_args": {"beta": 2}}, 2, ["beta=2"]),
    ({"method": "cd"}, 3, ["'cd' needs 2 models, got 3"]),
    ({"method": "sd"}, 3, ["'sd' needs 2 models"]),
    ({"method": "we"}, 1, ["'we' needs 2 or more models, got 1"]),
    ({"method": "sd", "method_args": {"first_proposer": 1}}, 2, ["unknown method_args ['first_proposer'] for 'sd'"]),
    ({"method": "we_se", "method_args": {"first_proposer": 5}}, 2, ["first_proposer=5", "0..1"]),
    ({"method": "sd", "method_args": {"proposer": "ngram"}}, 2, ["proposer='ngram'", "lookup+draft"]),
    ({"method": "we", "method_args": {"proposer": "lookup"}}, 2, ["unknown method_args ['proposer'] for 'we'"]),
    ({"method": "large_model", "temperature": -1}, 2, ["temperature=-1"]),
    ({"method": "large_model", "top_p": 0.0}, 2, ["top_p=0.0", "(0, 1]"]),
    ({"method": "large_model", "top_k": -3}, 2, ["top_k=-3"]),
    ({"method": "large_model", "max_new_tokens": -1}, 2, ["max_new_tokens=-1"]),
    ({"method": "large_model", "stop_strings": ["\n"]}, 2, ["stop_strings need a tokenizer"]),
]


@pytest.mark.parametrize("kwargs,n,words", CASES, ids=[str(c[0]) for c in CASES])
def test_bad_input_is_refused_before_decoding(models, counted, kwargs, n, words):
    with pytest.raises(ValueError) as err:
        generate(models[:n], PROMPT, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    for w in words:
        assert w in message
    assert not counted


def test_different_vocabularies_are_refused(counted):
    a, b = tiny_llama(60, vocab=32), tiny_llama(61, vocab=40)
    with pytest.raises(ValueError, match=r"different vocabularies \(model 0: 32, model 1: 40\)"):
        generate([a, b], PROMPT, "we_se")
    # a padded embedding matrix is fine once the shared size is given; extra ids are masked
    out = generate([a, b], PROMPT, "we_se", gamma=2, vocab_size=32, max_new_tokens=10)
    assert len(out.token_ids) == 10 and max(out.token_ids) < 32


def test_empty_prompt_and_empty_model_list(models):
    with pytest.raises(ValueError, match="prompt_ids"):
        generate(models[:1], [], "large_model")
    with pytest.raises(ValueError, match="non-empty list"):
        generate([], PROMPT, "large_model")
