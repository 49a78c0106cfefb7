"""llama.cpp's top-n-sigma and dynamic-temperature stages in our sampler (no model):
what each keeps or scales, and that a seeded sampler still takes one draw per token.
tests/server/test_llama_surface.py samples with both through the real server, plain and
speculative."""
import numpy as np
import pytest

from geniex.engine.sampling import Sampler, SamplingParams, dynamic_temperature, top_n_sigma

pytestmark = pytest.mark.fast

# mean 0.5, standard deviation sqrt(5/4) = 1.118 over the finite ones
LOGITS = np.array([2.0, 1.0, 0.0, -1.0, -np.inf], dtype=np.float32)


def kept(x):
    return [i for i, v in enumerate(x) if np.isfinite(v)]


def test_top_n_sigma_keeps_the_logits_within_n_deviations_of_the_top():
    assert kept(top_n_sigma(LOGITS, 1.0)) == [0, 1]          # cut at 2 - 1.118
    assert kept(top_n_sigma(LOGITS, 2.0)) == [0, 1, 2]       # cut at 2 - 2.236
    assert kept(top_n_sigma(LOGITS, 3.0)) == [0, 1, 2, 3]
    assert top_n_sigma(LOGITS, 1.0)[1] == LOGITS[1]          # kept logits are unchanged


def draws(params, logits, n=400):
    s = Sampler(params, len(logits))
    return [s.sample(logits) for _ in range(n)]


def test_the_sampler_runs_top_n_sigma_before_the_draw():
    logits = np.array([2.0, 1.9, 1.8, -3.0, -3.5], dtype=np.float32)
    free = set(draws(SamplingParams(temperature=3.0, seed=5), logits))
    cut = set(draws(SamplingParams(temperature=3.0, seed=5, top_n_sigma=0.5), logits))
    assert {3, 4} & free and cut == {0, 1, 2}


def test_dynamic_temperature_follows_the_candidates_entropy():
    p = SamplingParams(temperature=0.8, dynatemp_range=0.5, dynatemp_exponent=1.0)
    assert dynamic_temperature(np.zeros(8), p) == pytest.approx(1.3)                 # most uncertain: t + range
    peaked = np.array([0.0, -np.inf, -np.inf, -np.inf])
    assert dynamic_temperature(peaked, p) == pytest.approx(0.3)                      # certain: t - range
    two = np.array([0.0, 0.0, -np.inf, -np.inf])                                     # entropy log 2 of log 4
    assert dynamic_temperature(two, p) == pytest.approx(0.3 + 1.0 * 0.5)
    sq = SamplingParams(temperature=0.8, dynatemp_range=0.5, dynatemp_exponent=2.0)
    assert dynamic_temperature(two, sq) == pytest.approx(0.3 + 1.0 * 0.25)
    assert dynamic_temperature(np.zeros(1), p) == 0.8                                # one candidate: as set


def test_a_dynamic_range_samples_around_temperature_zero():
    p = SamplingParams(temperature=0.0, dynatemp_range=2.0, seed=3)
    assert not p.greedy
    logits = np.array([1.0, 0.9, 0.8, 0.7], dtype=np.float32)
    assert len(set(draws(p, logits))) > 1
    # zero entropy at temperature 0: the top candidate, and the draw is still taken
    one = Sampler(SamplingParams(temperature=0.0, dynatemp_range=2.0, top_n_sigma=0.1, seed=3), 4)
    ref = Sampler(SamplingParams(temperature=0.0, dynatemp_range=2.0, top_n_sigma=0.1, seed=3), 4)
    skewed = np.array([5.0, 0.0, 0.0, 0.0], dtype=np.float32)
    assert one.sample(skewed) == 0
    ref.rng.random()
    assert one.rng.random() == ref.rng.random()
