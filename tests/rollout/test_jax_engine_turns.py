"""JaxEngine multi-turn continuation (generate(continue_fn=...)): a slot goes on
from its KV cache with the environment's tokens; every turn's tokens and logprobs
must equal a cache-free forward over the whole history, through refills."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpt.models import decoder
from rlpt.rollout import GenerateRequest, SamplingParams, jax_engine

from engine_helpers import CFG, engine, logprob_tol, prompts, smollm2_tokenizer, tiny


@pytest.fixture(scope="module")
def tok():
  return smollm2_tokenizer()


@pytest.fixture(scope="module")
def model():
  return tiny(1)


@jax.jit
def _logsoftmax(params, seq):
  return jax.nn.log_softmax(decoder.forward(CFG, params, seq)[0], axis=-1)


def _env_ids(request, turn):
  rng = np.random.default_rng([request, turn])
  return [int(t) for t in rng.integers(10, 40000, size=int(rng.integers(1, 9)))]


def test_turns_continue_from_the_cache_and_match_a_full_forward(model, tok):
  eng = engine(model, tok, max_batch=8)
  starts = prompts(12, seed=4)
  turns = {i: [] for i in range(12)}

  def cont(i, s, c):
    turns[i].append(list(c.token_ids))
    if len(turns[i]) == 5:  # three model turns, two environment turns between
      return None
    env = _env_ids(i, len(turns[i]))
    turns[i].append(env)
    return env, 4 + i % 3

  sp = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
  out = eng.generate([GenerateRequest(prompt_ids=p, sampling=sp) for p in starts],
                     continue_fn=cont, context_len=128)
  st = eng.last_stats
  assert st.extensions == 24 and st.admissions > 1 and st.extend_tokens == sum(
      len(turns[i][k]) for i in turns for k in (1, 3))
  worst = 0.0
  for i, p in enumerate(starts):
    parts = turns[i]
    assert len(parts) == 5 and out[i].token_ids == parts[4]
    assert [len(parts[k]) for k in (0, 2, 4)] == [5, 4 + i % 3, 4 + i % 3]
    seq = list(p) + [t for part in parts for t in part]
    lp = np.asarray(_logsoftmax(model.arrays(), jnp.asarray([seq + [0] * (128 - len(seq))])))
    at = len(p)
    for k, part in enumerate(parts):
      if k % 2 == 0:  # a model turn: greedy = argmax at each position of the full forward
        rows = lp[at - 1:at - 1 + len(part)]
        assert part == [int(x) for x in rows.argmax(-1)], (i, k)
      at += len(part)
  # logprobs of the last turn against the full forward
    last = out[i]
    rows = lp[at - 1 - len(parts[4]):at - 1]
    got = np.asarray(last.logprobs)
    want = rows[np.arange(len(parts[4])), parts[4]]
    worst = max(worst, float(np.abs(got - want).max()))
    assert np.abs(got - want).max() < logprob_tol(rows), (i, got, want)
  assert worst < 1e-3


def test_bad_continuations_and_combinations_are_refused(model, tok):
  eng = engine(model, tok, max_batch=2)
  sp = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)
  req = [GenerateRequest(prompt_ids=(11, 12, 13), sampling=sp)]
  with pytest.raises(ValueError, match="needs >= 1 token"):
    eng.generate(req, continue_fn=lambda i, s, c: ([], 3), context_len=64)
  with pytest.raises(ValueError, match="exceed the slot's 64"):
    eng.generate(req, continue_fn=lambda i, s, c: ([5] * 40, 30), context_len=64)
  with pytest.raises(RuntimeError, match="environment broke"):
    def broken(i, s, c):
      raise RuntimeError("environment broke")
    eng.generate(req, continue_fn=broken, context_len=64)
  with pytest.raises(ValueError, match="stop string"):
    eng.generate([GenerateRequest(prompt_ids=(11, 12), sampling=SamplingParams(stop=("x",)))],
                 continue_fn=lambda i, s, c: None)
  with pytest.raises(ValueError, match="does not combine"):
    eng.generate(req, continue_fn=lambda i, s, c: None, deadline_s=5.0)
  with pytest.raises(ValueError, match="context_len"):
    eng.generate(req, continue_fn=lambda i, s, c: None, context_len=10**6)
  # the engine still works after a failed call
  assert len(eng.generate(req)[0].token_ids) == 3


def test_other_slots_decode_while_an_environment_answers_and_it_is_polled_often(
    model, tok, monkeypatch):
  """A slot whose environment is answering idles until the host next checks; the
  host checks every `answer_check_interval` decode steps (not every
  stop_check_interval), and the other slots decode meanwhile."""
  eng = engine(model, tok, max_batch=2, answer_check_interval=3, stop_check_interval=16)
  answering = threading.Event()  # set while the environment's call runs
  release = threading.Event()
  calls = []  # (max_steps, active slots) of decode calls made while it answered

  real_decode = jax_engine.decode.decode

  def spy(cfg, params, cache, state, max_steps, exit_free):
    if answering.is_set():
      calls.append((int(max_steps), int(np.sum(np.asarray(state.active)))))
      if len(calls) == 3:
        release.set()  # answer after three host checks
    return real_decode(cfg, params, cache, state, max_steps, exit_free)

  monkeypatch.setattr(jax_engine.decode, "decode", spy)
  seen = []

  def cont(i, s, c):
    seen.append(i)
    if i == 1 or seen.count(0) > 1:  # request 0: two model turns, one environment turn
      return None
    answering.set()
    assert release.wait(timeout=60), "the engine stopped checking for the answer"
    answering.clear()
    return [101, 102], 2

  short = SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)
  long = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
  out = eng.generate([GenerateRequest(prompt_ids=(11, 12, 13), sampling=short),
                      GenerateRequest(prompt_ids=(21, 22, 23), sampling=long)],
                     continue_fn=cont, context_len=96)
  assert [m for m, _ in calls[:3]] == [3, 3, 3]
  assert all(active == 1 for _, active in calls[:3])  # the long sample went on decoding
  assert len(out[0].token_ids) == 2 and len(out[1].token_ids) == 40 and seen.count(0) == 2
  assert eng.last_stats.extensions == 1
