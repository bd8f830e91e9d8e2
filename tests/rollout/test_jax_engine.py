"""JaxEngine mechanics on a small random decoder with SmolLM2's real tokenizer.

Every generated token is checked against the model itself: a greedy sample must
be the argmax of a full (cache-free) forward over prompt + completion, and every
returned logprob must equal that forward's log-softmax, whatever slot, refill
or batch the sample went through.
"""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from flax import nnx

from engine_helpers import (CFG, engine, full_logprobs, logprob_tol, prompts,  # noqa: F401
                            smollm2_tokenizer, tiny)
from rlpt.models import decoder
from rlpt.rollout import (GenerateRequest, JaxEngine, JaxEngineConfig, RolloutEngine,
                          SamplingParams)

@pytest.fixture(scope="module")
def tok():
  return smollm2_tokenizer()


@pytest.fixture(scope="module")
def model():
  return tiny(0)


def test_is_a_rollout_engine(model, tok):
  assert isinstance(engine(model, tok), RolloutEngine)


def test_greedy_and_logprobs_match_full_forward_through_refills(model, tok):
  # 12 requests x n=2 with mixed lengths through 8 slots: slots are refilled.
  eng = engine(model, tok)
  reqs = [GenerateRequest(prompt_ids=p, n=2, sampling=SamplingParams(
      max_new_tokens=4 + 2 * i, temperature=0.0, ignore_eos=True)) for i, p in enumerate(prompts(12))]
  out = eng.generate(reqs)
  assert len(out) == 24 and eng.last_stats.admissions > 1
  worst = tol = 0.0
  for i, c in enumerate(out):
    assert (c.request_id, c.sample_index) == (f"req-{i // 2}", i % 2)
    assert c.finish_reason == "length" and len(c.token_ids) == 4 + 2 * (i // 2)
    lp = full_logprobs(model, c)
    np.testing.assert_array_equal(np.argmax(lp, -1), c.token_ids)
    picked = lp[np.arange(len(c.token_ids)), c.token_ids]
    worst = max(worst, float(np.abs(picked - np.asarray(c.logprobs)).max()))
    tol = max(tol, logprob_tol(lp))
    assert c.sampling_logprobs == [0.0] * len(c.token_ids)  # greedy: q = 1
  assert worst < tol, (worst, tol)


def test_sampled_logprobs_and_determinism(model, tok):
  eng = engine(model, tok)
  sp = SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=11,
                      ignore_eos=True)
  reqs = [GenerateRequest(prompt_ids=p, n=3, sampling=sp) for p in prompts(4)]
  a = eng.generate(reqs)
  b = eng.generate(reqs)
  assert [c.token_ids for c in a] == [c.token_ids for c in b]
  assert len({tuple(c.token_ids) for c in a[:3]}) > 1  # the n samples differ
  c = eng.generate([GenerateRequest(prompt_ids=reqs[0].prompt_ids, n=3,
                                    sampling=dataclasses_replace(sp, seed=12))])
  assert [x.token_ids for x in c] != [x.token_ids for x in a[:3]]
  for x in a:
    lp = full_logprobs(model, x)
    picked = lp[np.arange(len(x.token_ids)), x.token_ids]
    np.testing.assert_allclose(x.logprobs, picked, rtol=0, atol=logprob_tol(lp))
    assert all(q <= 1e-6 for q in x.sampling_logprobs)


def dataclasses_replace(sp, **kw):
  import dataclasses
  return dataclasses.replace(sp, **kw)


def test_samples_do_not_depend_on_batch_mates_or_refill(model, tok):
  sp = SamplingParams(max_new_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
  reqs = [GenerateRequest(prompt_ids=p, n=2, sampling=sp) for p in prompts(6, seed=1)]
  together = engine(model, tok, max_batch=4).generate(reqs)
  static = engine(model, tok, max_batch=4, refill=False).generate(reqs)
  alone = engine(model, tok).generate(reqs[3:4])
  assert [c.token_ids for c in together] == [c.token_ids for c in static]
  assert [c.token_ids for c in together[6:8]] == [c.token_ids for c in alone]


def test_one_prefill_per_request_shared_by_its_samples(model, tok):
  eng = engine(model, tok)
  p = prompts(1)[0]
  out = eng.generate([GenerateRequest(prompt_ids=p, n=6, sampling=SamplingParams(
      max_new_tokens=8, temperature=0.0, ignore_eos=True))])
  assert eng.last_stats.prompt_tokens == len(p) and eng.last_stats.admissions == 1
  assert all(c.token_ids == out[0].token_ids for c in out)


def test_prompts_sharing_a_prefix_prefill_it_once_a_row_with_the_same_numbers(model, tok):
  # 10 prompts behind one 40-token template, as a chat template and a domain's
  # instructions precede every holdout prompt: the prefill holds the template once a
  # row; every greedy token and logprob still matches a full forward of its own prompt.
  template = tuple(range(1000, 1040))
  reqs = [GenerateRequest(prompt_ids=template + p, n=2, sampling=SamplingParams(
      max_new_tokens=6, temperature=0.0, ignore_eos=True)) for p in prompts(10, 3, 20, seed=7)]
  shared = engine(model, tok, max_batch=32)
  plain = engine(model, tok, max_batch=32, share_prefixes=False)
  a, b = shared.generate(reqs), plain.generate(reqs)
  assert shared.last_stats.shared_admissions >= 1 and plain.last_stats.shared_admissions == 0
  live = sum(len(r.prompt_ids) - 1 for r in reqs)
  assert shared.last_stats.prefill_columns < live < plain.last_stats.prefill_columns
  assert [c.token_ids for c in a] == [c.token_ids for c in b]
  worst = tol = 0.0
  for c in a:
    lp = full_logprobs(model, c)
    np.testing.assert_array_equal(np.argmax(lp, -1), c.token_ids)
    picked = lp[np.arange(len(c.token_ids)), c.token_ids]
    worst = max(worst, float(np.abs(picked - np.asarray(c.logprobs)).max()))
    tol = max(tol, logprob_tol(lp))
  assert worst < tol, (worst, tol)


def test_refill_keeps_slots_busier_than_static_batches(model, tok):
  # One long sample per batch of short ones: static batching idles the slots.
  reqs = [GenerateRequest(prompt_ids=p, sampling=SamplingParams(
      max_new_tokens=30 if i % 4 == 0 else 3, temperature=0.0, ignore_eos=True))
      for i, p in enumerate(prompts(16, seed=2))]
  cont = engine(model, tok, max_batch=4)
  stat = engine(model, tok, max_batch=4, refill=False)
  a, b = cont.generate(reqs), stat.generate(reqs)
  assert [c.token_ids for c in a] == [c.token_ids for c in b]
  assert cont.last_stats.generated_tokens == stat.last_stats.generated_tokens == 4 * 30 + 12 * 3
  assert cont.last_stats.decode_steps < 0.6 * stat.last_stats.decode_steps
  assert cont.last_stats.slot_utilisation > 0.8 > stat.last_stats.slot_utilisation


def test_stop_token_ids_and_max_new_tokens(model, tok):
  eng = engine(model, tok)
  p = prompts(1, seed=3)[0]
  free = eng.generate([GenerateRequest(prompt_ids=p, sampling=SamplingParams(
      max_new_tokens=16, temperature=0.0, ignore_eos=True))])[0]
  assert free.finish_reason == "length" and len(free.token_ids) == 16
  stop_tok = free.token_ids[5]
  k = free.token_ids.index(stop_tok)
  c = eng.generate([GenerateRequest(prompt_ids=p, sampling=SamplingParams(
      max_new_tokens=16, temperature=0.0, stop_token_ids=(stop_tok,)))])[0]
  assert c.finish_reason == "stop"
  assert c.token_ids == free.token_ids[:k + 1]  # the stop token stays in the ids
  assert c.text == tok.decode(free.token_ids[:k])  # but not in the text
  assert len(c.logprobs) == len(c.sampling_logprobs) == k + 1


def test_stop_strings_cut_text_and_tokens(model, tok):
  eng = engine(model, tok, stop_check_interval=4)
  p = prompts(1, seed=4)[0]
  free = eng.generate([GenerateRequest(prompt_ids=p, sampling=SamplingParams(
      max_new_tokens=30, temperature=0.0, ignore_eos=True))])[0]
  full = tok.decode(free.token_ids)
  stop = full[len(tok.decode(free.token_ids[:15])):][:3]
  assert stop.strip()
  c = eng.generate([GenerateRequest(prompt_ids=p, sampling=SamplingParams(
      max_new_tokens=30, temperature=0.0, ignore_eos=True, stop=(stop, "\x00never")))])[0]
  assert c.finish_reason == "stop"
  assert c.text == full[:full.find(stop)]
  assert stop in tok.decode(c.token_ids) and stop not in tok.decode(c.token_ids[:-1])
  assert c.token_ids == free.token_ids[:len(c.token_ids)] and len(c.token_ids) < 30


def test_chat_messages_use_the_template(model, tok):
  eng = engine(model, tok)
  msgs = ({"role": "user", "content": "Hello there"},)
  c = eng.generate([GenerateRequest(messages=msgs, sampling=SamplingParams(max_new_tokens=2))])[0]
  assert c.prompt_ids == tok.encode(tok.apply_chat_template(list(msgs), add_generation_prompt=True))
  with pytest.raises(ValueError, match="request 0: every message needs 'role'"):
    eng.generate([GenerateRequest(messages=({"content": "x"},))])


def test_budget_and_length_errors(model, tok):
  p = prompts(1)[0]
  with pytest.raises(ValueError, match=r"request 1: .*kv_cache_mib"):
    engine(model, tok, kv_cache_mib=0.05).generate([
        GenerateRequest(prompt_ids=p[:3], sampling=SamplingParams(max_new_tokens=1)),
        GenerateRequest(prompt_ids=p, sampling=SamplingParams(max_new_tokens=2000))])
  with pytest.raises(ValueError, match=r"request 0: prompt .* exceeds JaxEngineConfig.max_len=64"):
    engine(model, tok, max_len=64).generate([GenerateRequest(
        prompt_ids=p, sampling=SamplingParams(max_new_tokens=60))])
  short = tiny(0)
  short.config = short.config.replace(max_position_embeddings=32)
  with pytest.raises(ValueError, match=r"request 0: prompt \(29 tokens\) \+ max_new_tokens "
                     r"\(8\) exceeds the model's context.*=32: prompts of up to 24 tokens fit"):
    engine(short, tok).generate([GenerateRequest(
        prompt_ids=prompts(1, lo=29, hi=30)[0], sampling=SamplingParams(max_new_tokens=8))])
  with pytest.raises(ValueError, match=r"request 0: SamplingParams.top_p"):
    engine(model, tok).generate([GenerateRequest(prompt_ids=p, sampling=SamplingParams(top_p=0))])
  # A budget for 2 slots of this length (10 + 20 tokens -> a 32-slot row of
  # 2 (k, v) x 2 layers x 32 slots x 2 KV heads x 16 dims x 4 bytes): 8 samples still
  # run, 2 at a time.
  eng = engine(model, tok, kv_cache_mib=2 * 2 * 2 * 32 * 2 * 16 * 4 / 2 ** 20)
  out = eng.generate([GenerateRequest(prompt_ids=p[:10], n=8, sampling=SamplingParams(
      max_new_tokens=20, temperature=0.0, ignore_eos=True))])
  assert eng.last_stats.slots == 2 and len(out) == 8


def test_compiles_are_bounded_by_buckets(model, tok):
  eng = engine(model, tok)
  sp = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
  # Eight prompts of 3-29 tokens: rows of 32, 64 or 128 columns (their bucket, or wider
  # where it packs tighter) and 1-8 rows rounded to a power of two; cache lengths of 32
  # or 64 (the longest + 4, rounded to 32). Decode compiles once per cache length; the
  # prefill once per row shape; the install (cheap to compile) per row shape and cache
  # length.
  # (The jitted programs are shared by every engine in the process: count new ones.)
  before = eng.compiled_programs()
  for seed in range(5, 11):
    eng.generate([GenerateRequest(prompt_ids=p, sampling=sp)
                  for p in prompts(8, 3, 30, seed=seed)])
  after = eng.compiled_programs()
  new = {k: after[k] - before[k] for k in after}
  assert new["decode"] <= 2 and new["prefill"] <= 4 and new["install"] <= 8, new
  # The same prompts with more new tokens (longer caches, 96 and 128 slots): new
  # installs and decode loops, never a new prefill.
  before = eng.compiled_programs()
  for max_new in (40, 70):
    eng.generate([GenerateRequest(prompt_ids=p, sampling=SamplingParams(
        max_new_tokens=max_new, temperature=0.0, ignore_eos=True))
        for p in prompts(8, 3, 30, seed=5)])
  after = eng.compiled_programs()
  assert after["prefill"] == before["prefill"], (before, after)
  assert after["install"] > before["install"] and after["decode"] > before["decode"]


def test_update_weights_swaps_without_recompiling(model, tok, tmp_path):
  eng = engine(model, tok)
  reqs = [GenerateRequest(prompt_ids=p, sampling=SamplingParams(
      max_new_tokens=8, temperature=0.0, ignore_eos=True)) for p in prompts(3, seed=7)]
  a = eng.generate(reqs)
  compiled = eng.compiled_programs()
  other = tiny(1)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "v1", other.arrays())
  ckpt.wait_until_finished()
  st = eng.update_weights(str(tmp_path / "v1"), version=1)
  assert st.version == 1 and st.bytes == sum(x.nbytes for x in jax.tree.leaves(other.arrays()))
  b = eng.generate(reqs)
  assert all(c.weight_version == 1 for c in b) and a[0].weight_version == 0
  for c in b:
    np.testing.assert_array_equal(np.argmax(full_logprobs(other, c), -1), c.token_ids)
  assert [c.token_ids for c in a] != [c.token_ids for c in b]
  eng.update_weights(model, version=2)  # a pytree (a Decoder) brings the old outputs back
  assert [c.token_ids for c in eng.generate(reqs)] == [c.token_ids for c in a]
  assert eng.compiled_programs() == compiled
  bad = dict(model.arrays(), embed=jnp.zeros((10, 64)))
  with pytest.raises(ValueError, match=r"tensor \['embed'\] has shape \(10, 64\)"):
    eng.update_weights(bad, version=3)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    eng.update_weights(str(tmp_path / "missing"), version=3)
  assert eng.weight_version == 2


def test_deadline_aborts(model, tok):
  eng = engine(model, tok, max_batch=4)
  out = eng.generate([GenerateRequest(prompt_ids=p, sampling=SamplingParams(
      max_new_tokens=30, ignore_eos=True)) for p in prompts(4)], deadline_s=0.0)
  assert [c.finish_reason for c in out] == ["abort"] * 4
  assert all(len(c.token_ids) < 30 for c in out)


def test_max_wall_s_cuts_each_sample_from_its_admission_and_frees_its_slot(model, tok):
  # 2 slots, 3 requests: the capped ones end at their first host check (a cap of 1 us
  # is past after any decode chunk) with the tokens sampled so far, finish_reason
  # "time"; the uncapped one runs its whole budget; the third request, queued until a
  # capped sample freed its slot, still gets its first chunk: the cap counts from
  # admission, not from the call.
  eng = engine(model, tok, max_batch=2, stop_check_interval=4)
  ps = prompts(3, seed=5)
  def req(p, seed, cap):
    return GenerateRequest(prompt_ids=p, sampling=SamplingParams(
        max_new_tokens=40, ignore_eos=True, seed=seed, max_wall_s=cap))
  out = eng.generate([req(ps[0], 1, 1e-6), req(ps[1], 2, None), req(ps[2], 3, 1e-6)])
  assert [c.finish_reason for c in out] == ["time", "length", "time"]
  assert [len(c.token_ids) for c in out] == [4, 40, 4]
  assert eng.last_stats.wall_capped == 2
  uncapped = eng.generate([req(ps[0], 1, None), req(ps[2], 3, None)])
  for cut, full in zip((out[0], out[2]), uncapped):  # the same samples, cut short
    assert cut.token_ids == full.token_ids[:4]
    np.testing.assert_allclose(cut.logprobs, full.logprobs[:4], rtol=0, atol=1e-4)
  with pytest.raises(ValueError, match="max_wall_s"):
    SamplingParams(max_wall_s=0.0)


def test_partial_rollouts_adopt_new_weights_between_chunks(model, tok, monkeypatch):
  """generate(adopt_weights=True) with an update_weights landing during its second decode
  chunk: the tokens sampled before the swap are exactly the old weights' (version 0),
  every later token is version 1's (token_versions switches once, at the chunk
  boundary), and without adopt_weights the same swap changes nothing of that call."""
  from rlpt.rollout import decode as decode_lib
  from rlpt.rollout.jax_engine import token_versions
  assert token_versions([(0, 3), (5, 4)], 8) == [3] * 5 + [4] * 3
  assert token_versions([(0, 3), (5, 4)], 4) == [3] * 4
  interval, new = 4, tiny(1)
  reqs = [GenerateRequest(prompt_ids=p, n=2, sampling=SamplingParams(
      max_new_tokens=20, temperature=0.0, ignore_eos=True)) for p in prompts(3, seed=3)]
  old = engine(model, tok, stop_check_interval=interval).generate(reqs)
  real, calls = decode_lib.decode, []

  def decode_and_update(*args):
    calls.append(1)
    if len(calls) == 2:  # an update arriving while the second chunk decodes
      eng.update_weights(new, version=1)
    return real(*args)

  monkeypatch.setattr(decode_lib, "decode", decode_and_update)
  for adopt in (False, True):
    eng, calls[:] = engine(model, tok, stop_check_interval=interval), []
    # (a far deadline makes the call decode in chunks whether or not it adopts)
    out = eng.generate(reqs, adopt_weights=adopt, deadline_s=1e6)
    assert eng.weight_version == 1
    if not adopt:  # the update waits for the call: old weights throughout
      assert [c.token_ids for c in out] == [c.token_ids for c in old]
      assert all(c.weight_version == 0 and c.token_versions is None for c in out)
      continue
    assert eng.last_stats.weight_swaps == 1
    for c, o in zip(out, old):
      k = 2 * interval  # two chunks ran on version 0
      assert c.weight_version == 0 and c.token_versions == [0] * k + [1] * (20 - k)
      assert c.token_ids[:k] == o.token_ids[:k]
      np.testing.assert_allclose(c.logprobs[:k], o.logprobs[:k], rtol=0, atol=1e-6)
    # the later tokens come from the new weights: they and their logprobs differ
    assert any(c.token_ids[k:] != o.token_ids[k:] for c, o in zip(out, old))
    assert all(np.abs(np.subtract(c.logprobs[k:], o.logprobs[k:])).max() > 1e-3
               for c, o in zip(out, old))


def test_long_prompts_prefill_blockwise_and_continue_as_the_dense_prefill(tok, monkeypatch):
  """A prompt at or past ModelConfig.blockwise_from is prefilled in tiles, over its
  length rounded to length_multiple (not its power-of-two bucket), beside a short
  prompt in the same admission; greedy continuations and logprobs equal an engine whose
  prefill is dense, and the KV cache is sized from the request."""
  from rlpt.models import decoder as dec
  monkeypatch.setattr(dec, "BLOCKWISE_TILE", 32)
  tiles = []
  blockwise = dec.blockwise_attention
  monkeypatch.setattr(dec, "blockwise_attention",
                      lambda *a, **k: tiles.append(a[0].shape[1]) or blockwise(*a, **k))
  long_p = prompts(1, lo=150, hi=151, seed=3)[0]
  short_p = prompts(1, lo=20, hi=21, seed=4)[0]
  reqs = [GenerateRequest(prompt_ids=p, sampling=SamplingParams(
      max_new_tokens=6, temperature=0.0, ignore_eos=True)) for p in (long_p, short_p)]
  outs = []
  for start in (0, 128):
    m = tiny(0)
    m.config = m.config.replace(blockwise_from=start)
    eng = engine(m, tok, max_len=256)
    outs.append(eng.generate(reqs))
    assert eng.last_stats.admissions == 1   # both prompts in one prefill
  dense, tiled = outs
  # the tiled engine's prefill (traced once): 149 tokens -> 160 columns (a multiple of
  # length_multiple = 32), not the power-of-two 256
  assert tiles == [160]
  for a, b in zip(dense, tiled):
    assert b.token_ids == a.token_ids
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-4)


def test_bf16_compute_decodes_from_bf16_projection_weights_with_the_same_numbers(tok):
  """With compute dtype bfloat16 the decode loop holds its projection weights in bf16
  (half the bytes a step reads); `proj` rounds every weight to the compute dtype anyway
  (on CPU to bf16 values held in fp32, rlpt.ops.dots.dot_operand), so samples and
  logprobs equal those of fp32-held weights exactly."""
  m = tiny(0)
  m.config = m.config.replace(dtype="bfloat16")
  reqs = [GenerateRequest(prompt_ids=p, n=2, sampling=SamplingParams(
      max_new_tokens=6, temperature=1.0, seed=5)) for p in prompts(3)]
  eng = engine(m, tok)
  stacked = eng.decode_params["layers"]
  leaves = stacked if isinstance(stacked, dict) else stacked[0]
  for name, w in leaves.items():
    ws = w if isinstance(w, tuple) else (w,)
    want = jnp.bfloat16 if name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down") \
        else jnp.float32
    assert all(x.dtype == want for x in ws), name
  assert eng.params["layers"]["wq"].dtype == jnp.float32      # the prefill's stay fp32
  got = eng.generate(reqs)
  eng32 = engine(m, tok)
  eng32._weight_dtype = None                                    # fp32-held weights
  eng32.update_weights(m, version=0)
  held = eng32.decode_params["layers"]
  wq = (held if isinstance(held, dict) else held[0])["wq"]
  assert all(x.dtype == jnp.float32 for x in (wq if isinstance(wq, tuple) else (wq,)))
  want = eng32.generate(reqs)
  for a, b in zip(got, want):
    assert a.token_ids == b.token_ids
    np.testing.assert_array_equal(a.logprobs, b.logprobs)


def test_weights_replicated_over_a_mesh_run_on_one_device(tok):
  """A learner mesh that splits no weight (here `seq` = 4) hands the engine weights
  whole on 4 devices; the engine takes one device's copy (not 4 copies of every step and
  of the KV cache), decodes as the single-device engine, and weight updates from the
  replicated learner land there too."""
  from jax.sharding import NamedSharding, PartitionSpec
  from rlpt.models import sharding as shd
  mesh = shd.make_mesh(seq=4)
  m = tiny(0)
  state = nnx.state(m, nnx.Param)
  nnx.update(m, jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec())),
                             state))
  assert all(len(x.sharding.device_set) == 4 for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
  eng = engine(m, tok)
  assert {d for x in jax.tree.leaves(eng.params) for d in x.sharding.device_set} == {
      mesh.devices.flat[0]}
  reqs = [GenerateRequest(prompt_ids=p, sampling=SamplingParams(
      max_new_tokens=5, temperature=0.0, ignore_eos=True)) for p in prompts(3, seed=5)]
  ref = engine(tiny(0), tok).generate(reqs)
  got = eng.generate(reqs)
  for a, b in zip(ref, got):
    assert b.token_ids == a.token_ids
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
  eng.update_weights(m, version=1)
  assert len({d for x in jax.tree.leaves(eng.params) for d in x.sharding.device_set}) == 1
  assert [c.token_ids for c in eng.generate(reqs)] == [c.token_ids for c in got]


def test_long_prefill_runs_over_the_learners_seq_ring(tok):
  """Weights in a context-parallel learner's layout (split over `seq` = 4 by the rules
  table, batch over data = 2) decode on one device, and prompts of blockwise_from
  tokens or more are prefilled as ring attention over the mesh: the greedy
  continuations and logprobs equal the single-device engine's (blockwise prefill),
  short prompts keep the one-device prefill, and a weight update reaches the ring."""
  from rlpt.models import sharding as shd
  mesh = shd.make_mesh(data=2, seq=4)
  cfg = CFG.replace(blockwise_from=64)
  ref_model, m = tiny(0), tiny(0)
  ref_model.config = m.config = cfg
  shardings = shd.state_shardings(nnx.state(m, nnx.Param), mesh)
  place = lambda st: jax.tree.map(  # noqa: E731
      lambda v, s: v.replace(jax.device_put(v.get_value(), s)), st, shardings,
      is_leaf=lambda x: isinstance(x, nnx.Variable))
  nnx.update(m, place(nnx.state(m, nnx.Param)))
  assert any(x.sharding.spec and "seq" in str(x.sharding.spec)
             for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
  eng, ref = engine(m, tok, max_len=512), engine(ref_model, tok, max_len=512)
  assert len({d for x in jax.tree.leaves(eng.params) for d in x.sharding.device_set}) == 1
  sp = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
  long = [GenerateRequest(prompt_ids=p, sampling=sp) for p in prompts(3, 90, 300, seed=7)]
  short = [GenerateRequest(prompt_ids=p, sampling=sp) for p in prompts(2, 5, 20, seed=8)]
  got, want = eng.generate(long), ref.generate(long)
  assert eng.ring_prefills >= 1
  for a, b in zip(want, got):
    assert b.token_ids == a.token_ids
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-4)
  n = eng.ring_prefills
  assert [c.token_ids for c in eng.generate(short)] == [c.token_ids for c in ref.generate(short)]
  assert eng.ring_prefills == n   # 32-token bucket: below blockwise_from, one device
  # New weights (another seed's, in the learner's layout) reach the ring prefill too.
  other = tiny(1)
  eng.update_weights(place(nnx.state(other, nnx.Param)), version=1)
  ref.update_weights(nnx.state(other, nnx.Param), version=1)
  got, want = eng.generate(long), ref.generate(long)
  assert eng.ring_prefills > n
  assert [c.token_ids for c in got] == [c.token_ids for c in want]
