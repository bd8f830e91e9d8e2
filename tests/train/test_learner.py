"""The learner on a tiny random decoder: fitting, ratio = 1 on-policy, microbatch
gradient = full-batch gradient, sharded = unsharded, KL to the reference, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from rlpt.algorithms import AlgoSpec
from rlpt.models import Decoder, ModelConfig, token_logprobs
from rlpt.train import learner as learner_lib
from rlpt.train import packing
from rlpt.train.learner import Learner, metrics_to_host
from rlpt.train.optim import OptimConfig

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8)
B, T, PROMPT = 8, 10, 4


def _model(seed=0):
  return Decoder(CFG, rngs=nnx.Rngs(seed))


def _data(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
  attn = np.ones((B, T), bool)
  attn[1, :2] = False                     # left padding in one prompt
  attn[2, -2:] = False                    # a completion that stopped early
  loss_mask = np.zeros((B, T), bool)
  loss_mask[:, PROMPT:] = True
  loss_mask &= attn
  return tokens, attn, loss_mask


@pytest.fixture(scope="module")
def data():
  return _data()


def test_fits_a_fixed_batch_and_loss_decreases(data):
  tokens, attn, lm = data
  lrn = Learner(_model(), AlgoSpec(loss_agg="token_mean"), OptimConfig(lr=1e-2),
                microbatch_size=4)
  start = lrn.logprobs(tokens, attn, lm)
  rewards = np.ones(B, np.float32)
  # fixed rollout logprobs (off-policy after step 0): -mean(ratio) falls until clipped
  batch = lrn.prepare(tokens, attn, lm, start, rewards, group_size=4, pad_multiple=1)
  batch = batch._replace(advantages=batch.loss_mask.astype(jnp.float32))  # A = +1 everywhere
  losses = [metrics_to_host(lrn.step(batch))["loss"] for _ in range(6)]
  assert losses[0] == pytest.approx(-1.0, abs=1e-5)
  # A = +1: the clipped surrogate bottoms out at -(1 + eps_high) = -1.2
  assert -1.2 - 1e-5 <= losses[-1] < -1.1 and losses[-1] < losses[1] < losses[0]
  # on-policy refresh each step: the model fits the batch's completion tokens
  for _ in range(25):
    batch = batch._replace(old_logprobs=lrn.batch_logprobs(batch))
    pending = lrn.step(batch)
  m = metrics_to_host(pending)
  end = lrn.logprobs(tokens, attn, lm)
  mean = lambda x: float((np.asarray(x) * lm).sum() / lm.sum())
  assert mean(start) < -3.5 and mean(end) > -0.5, (mean(start), mean(end))
  assert m["clip_frac"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
  assert int(lrn.state.step) == 31


@pytest.fixture(scope="module")
def grpo_learner():
  spec = AlgoSpec(advantage="group_norm", loss_agg="seq_mean_token_mean", kl_coef=0.1,
                  kl_estimator="k3", kl_in="loss", entropy_coef=0.01)
  return Learner(_model(1), spec, OptimConfig(lr=1e-3), microbatch_size=2)


def test_ratio_is_one_on_policy_and_kl_starts_at_zero(grpo_learner, data):
  tokens, attn, lm = data
  lrn = grpo_learner
  # an engine running the same weights: its logprobs, computed independently
  engine_lp = token_logprobs(lrn.model(), tokens, lm, attention_mask=attn)
  rewards = np.array([1, 0, 0, 1, 1, 1, 0, 1], np.float32)
  batch = lrn.prepare(tokens, attn, lm, engine_lp, rewards, group_size=4, pad_multiple=1)
  m = metrics_to_host(lrn.step(batch))
  assert m["logprob_gap_max"] < 1e-4
  assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["clip_frac"] == 0.0
  assert m["kl"] == pytest.approx(0.0, abs=1e-6)     # policy == reference at step 0
  assert m["response_len"] == pytest.approx(lm.sum() / B)
  assert m["grad_norm"] > 0 and m["entropy"] > 3.0   # near log(64) for a random model
  assert m["lr"] == pytest.approx(1e-3)
  m2 = metrics_to_host(lrn.step(batch))
  assert m2["kl"] > 0 and m2["logprob_gap_max"] > 1e-4  # the policy moved off both


def test_group_advantages_in_prepare(grpo_learner, data):
  tokens, attn, lm = data
  rewards = np.array([1, 0, 0, 1, 1, 1, 1, 1], np.float32)
  batch = grpo_learner.prepare(tokens, attn, lm, np.zeros((B, T)), rewards, group_size=4)
  a = 0.5 / (1 / np.sqrt(3) + 1e-6)
  lm_w = np.asarray(batch.loss_mask)
  expected = np.array([a, -a, -a, a, 0, 0, 0, 0])[:, None] * lm_w
  # random prompts share nothing: one sequence per row, padded to 64 (masked) so that
  # varying lengths reuse compiled steps; the completion window holds the 6 scored tokens
  assert batch.tokens.shape == (B, 64) and batch.src.shape == (B, 8)
  assert (lm_w.sum(axis=1) == lm.sum(axis=1)).all()
  np.testing.assert_allclose(batch.advantages, expected, rtol=1e-5)
  assert (np.asarray(batch.segments)[:, T:] == -1).all()


def _full_batch_loss(model, tokens, attn, lm, old_lp, adv):
  """token-mean PPO loss in the row layout, written directly with token_logprobs."""
  lp = token_logprobs(model, tokens, lm, attention_mask=attn)
  ratio = jnp.exp(lp - old_lp)
  m = jnp.asarray(lm, jnp.float32)
  return jnp.sum(-adv * ratio * m) / m.sum()


def test_microbatched_gradient_equals_full_batch(data):
  tokens, attn, lm = data
  spec = AlgoSpec(loss_agg="token_mean")
  model = _model(2)
  graphdef, params = nnx.split(model)
  lp = token_logprobs(model, tokens, lm, attention_mask=attn)
  rng = np.random.default_rng(1)
  adv = jnp.asarray(rng.normal(size=(B, T)) * lm, jnp.float32)
  pk = packing.pack(tokens, attn, lm)
  zeros = jnp.zeros(pk.src.shape)
  batch = learner_lib.Batch(pk.tokens, pk.positions, pk.segments, pk.src, pk.targets,
                            pk.loss_mask, pk.to_window(np.asarray(lp)),
                            pk.to_window(np.asarray(adv)), zeros, zeros, zeros,
                            jnp.ones(pk.src.shape))
  # 4 microbatches of 2 rows, accumulated in the learner's scan ...
  grads, stats = jax.jit(
      lambda p, b: learner_lib.loss_and_grads(graphdef, spec, 4, 4, p, b))(params, batch)
  # ... against the gradient of the whole batch's loss, written independently
  ref = jax.jit(jax.grad(lambda p: _full_batch_loss(nnx.merge(graphdef, p), tokens, attn, lm,
                                                    lp, adv)))(params)
  for x, y in zip(jax.tree.leaves(grads), jax.tree.leaves(ref)):
    np.testing.assert_allclose(x, y, rtol=2e-4, atol=1e-7)
  assert float(stats["tokens"]) == lm.sum()


def test_sharded_step_matches_single_device(data):
  tokens, attn, lm = data
  spec = AlgoSpec(loss_agg="seq_mean_token_sum")
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2, 1), ("data", "fsdp", "tensor", "seq"))
  out = []
  for m in (None, mesh):
    lrn = Learner(_model(3), spec, OptimConfig(lr=1e-3), microbatch_size=4, mesh=m)
    lp = lrn.logprobs(tokens, attn, lm)
    batch = lrn.prepare(tokens, attn, lm, lp, np.arange(B, dtype=np.float32), group_size=2,
                        pad_multiple=1)
    out.append((metrics_to_host(lrn.step(batch)), lrn))
  (m1, l1), (m2, l2) = out
  for k in ("loss", "grad_norm", "entropy", "response_len"):
    assert m1[k] == pytest.approx(m2[k], rel=1e-4), k
  wq = l2.state.params["layers"]["wq"][...]
  assert len(wq.sharding.device_set) == 8 and wq.sharding.spec[1] == "fsdp"
  for x, y in zip(jax.tree.leaves(l1.state.params), jax.tree.leaves(l2.state.params)):
    np.testing.assert_allclose(x, y, atol=1e-4)  # Adam step ~ lr * sign(g), lr = 1e-3


def test_sequence_sharded_step_equals_the_unsharded_step(monkeypatch):
  """On a ("data", "seq") = (2, 4) mesh the packed sequences (a group's prompt run once,
  its continuations after it: segment ids) go through ring attention; logprobs, the
  step's metrics and the updated parameters equal one device's over two steps."""
  tokens, attn, lm = _data(5)
  tokens[1::2, :PROMPT] = tokens[0::2, :PROMPT]   # groups of 2 share their prompt
  attn[1::2, :PROMPT] = attn[0::2, :PROMPT]
  spec = AlgoSpec(loss_agg="seq_mean_token_sum")
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 1, 1, 4), ("data", "fsdp", "tensor", "seq"))
  from rlpt.models import decoder
  rings = []
  ring = decoder.ring_attention
  monkeypatch.setattr(decoder, "ring_attention",
                      lambda *a, **k: rings.append(k["shared_prefix"]) or ring(*a, **k))
  out = []
  for m in (None, mesh):
    lrn = Learner(_model(4), spec, OptimConfig(lr=1e-3), microbatch_size=4, mesh=m)
    assert lrn.seq_shards == (1 if m is None else 4)
    lp = lrn.logprobs(tokens, attn, lm)
    steps = []
    for i in range(2):
      batch = lrn.prepare(tokens, attn, lm, lp, np.arange(B, dtype=np.float32) * (i + 1),
                          group_size=2, pad_multiple=1)
      assert int(np.asarray(batch.segments).max()) == 2   # shared prompts were packed
      steps.append(metrics_to_host(lrn.step(batch)))
    out.append((lp, steps, lrn))
  (lp1, s1, l1), (lp2, s2, l2) = out
  assert rings and all(rings)   # traced through the ring, with the shared-prompt mask
  np.testing.assert_allclose(lp2, lp1, atol=1e-5)
  assert tuple(l2.prepare(tokens, attn, lm, lp2, np.zeros(B, np.float32), group_size=2,
                          pad_multiple=1).tokens.sharding.spec) == ("data", "seq")
  for a, b in zip(s1, s2):
    for k in ("loss", "grad_norm", "entropy", "response_len"):
      assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
  for x, y in zip(jax.tree.leaves(l1.state.params), jax.tree.leaves(l2.state.params)):
    np.testing.assert_allclose(y, x, atol=2e-5)


def test_bad_input_is_named(grpo_learner, data):
  tokens, attn, lm = data
  with pytest.raises(ValueError, match="rewards has shape"):
    grpo_learner.prepare(tokens, attn, lm, np.zeros((B, T)), np.zeros(3), group_size=4)
  with pytest.raises(ValueError, match="loss_mask has shape"):
    grpo_learner.prepare(tokens, attn, lm[:, 1:], np.zeros((B, T)), np.zeros(B), group_size=4)
  batch = grpo_learner.prepare(tokens, attn, lm, np.zeros((B, T)), np.zeros(B), group_size=4)
  with pytest.raises(ValueError, match="not a multiple of config.rl.microbatch_size"):
    grpo_learner.step(jax.tree.map(lambda x: x[:5], batch))


def test_ppo_value_head_gae_and_value_loss(data):
  tokens, attn, lm = data
  spec = AlgoSpec(advantage="gae", gamma=1.0, gae_lambda=0.5, value_coef=0.5, value_clip=10.0)
  lrn = Learner(_model(4), spec, OptimConfig(lr=1e-2), microbatch_size=4)
  rewards = np.linspace(0, 1, B).astype(np.float32)
  lp = lrn.logprobs(tokens, attn, lm)
  batch = lrn.prepare(tokens, attn, lm, lp, rewards, group_size=1, pad_multiple=1)
  # the value head starts at 0: A_t = lambda^(k) R with k tokens to the end, returns = A
  last = T - 1 - np.argmax(lm[:, ::-1], axis=1)
  k = last[:, None] - np.arange(T)[None]
  expected = np.where(lm, rewards[:, None] * 0.5 ** np.maximum(k, 0), 0.0)
  pk = packing.pack(tokens, attn, lm)
  np.testing.assert_allclose(batch.advantages, pk.to_window(expected), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(batch.returns, pk.to_window(expected), rtol=1e-5, atol=1e-7)
  vls = []
  for _ in range(8):
    batch = batch._replace(old_values=lrn.batch_values(batch))
    vls.append(metrics_to_host(lrn.step(batch))["value_loss"])
  # value_loss = token-mean of (V - R)^2 / 2 with V = 0 at step 0
  r2 = float((expected ** 2).sum() / lm.sum()) / 2
  assert vls[0] == pytest.approx(r2, rel=1e-4)
  assert vls[-1] < 0.5 * vls[0]
  assert float(jnp.abs(lrn.state.value_head["w"]).sum()) > 0


def test_second_step_does_not_recompile_for_loaded_weights(data):
  model = _model()
  # Weights as the loader hands them over: placed on (committed to) their device, while
  # fresh optimizer state and counters are not, until the first step returns them.
  dev = jax.devices()[0]
  nnx.update(model, jax.tree.map(lambda x: jax.device_put(x, dev), nnx.state(model, nnx.Param)))
  assert jax.tree.leaves(nnx.state(model, nnx.Param))[0]._committed
  tokens, attn, loss_mask = data
  lrn = Learner(model, AlgoSpec(), OptimConfig(lr=1e-3), microbatch_size=4)
  old = lrn.logprobs(tokens, attn, loss_mask)
  batch = lrn.prepare(tokens, attn, loss_mask, old, np.arange(B, dtype=np.float32), group_size=4)
  for _ in range(3):
    metrics_to_host(lrn.step(batch))
  assert lrn._compiled(B, B)._cache_size() == 1


def test_update_takes_a_rollout_batch_and_enforces_max_staleness():
  """`update(batch)`: one step on a collector's batch, advantages per trained row, and a
  row more than max_staleness versions behind the learner is refused."""
  from rlpt.train.batch import RolloutBatch, pack_rows
  from rlpt.types import RewardResult, Rollout, Task
  rng = np.random.default_rng(3)

  def batch(versions):
    rs = [Rollout(task=Task("synthetic", "1="), prompt_ids=[1, 5, 6],
                  completion_ids=rng.integers(3, CFG.vocab_size, 3).tolist(),
                  completion_text="", logprobs=[-1.0] * 3, weight_version=v,
                  finish_reason="stop", group_id=i // 2, reward=RewardResult(score=i % 2))
          for i, v in enumerate(versions)]
    rewards = np.array([i % 2 for i in range(len(rs))], np.float32)
    return RolloutBatch(rollouts=tuple(rs), rewards=rewards, trained=np.arange(len(rs)),
                        rows=pack_rows(rs, rewards, pad_id=0, rows=4), group_size=2)

  lrn = Learner(_model(7), AlgoSpec(), OptimConfig(lr=1e-3), microbatch_size=4,
                max_staleness=1, length_multiple=8)
  m, adv = lrn.update(batch([0, 0, 0, 0]))
  assert lrn.version == 1 and int(lrn.state.step) == 1 and np.isfinite(m["loss"])
  # group_norm of each (0, 1) pair: (r - 0.5) / std with ddof 1 (0.7071)
  np.testing.assert_allclose(adv, np.array([-1, 1, -1, 1]) / np.sqrt(2), atol=1e-4)
  assert m["staleness"] == 0 and m["staleness_max"] == 0
  m, _ = lrn.update(batch([0, 0, 1, 1]))  # one version behind: allowed
  assert m["staleness_max"] == 1 and m["staleness"] == 0.5
  with pytest.raises(ValueError, match=r"weight versions \[0, 2\] for a learner at version 2"):
    lrn.update(batch([0, 0, 2, 2]))
  empty = RolloutBatch(rollouts=(), rewards=np.zeros(0, np.float32),
                       trained=np.zeros(0, np.int64),
                       rows=pack_rows([], np.zeros(0), pad_id=0, rows=4), group_size=2)
  assert lrn.update(empty)[0]["skipped_update"] == 1.0 and lrn.version == 3


def test_padding_rows_change_nothing_but_the_shape():
  """The same trained rows padded to 8 rows or to 4 (Settings.learner_rows shrinks the
  padding when dynamic sampling keeps few groups): the same loss, advantages and
  updated parameters."""
  from rlpt.train.batch import RolloutBatch, pack_rows
  from rlpt.types import RewardResult, Rollout, Task
  rng = np.random.default_rng(5)
  rs = [Rollout(task=Task("synthetic", "1="), prompt_ids=[1, 5, 6],
                completion_ids=rng.integers(3, CFG.vocab_size, 2 + i).tolist(),
                completion_text="", logprobs=[-1.0] * (2 + i), weight_version=0,
                finish_reason="stop", group_id=i // 2, reward=RewardResult(score=i % 2))
        for i in range(4)]
  rewards = np.array([0, 1, 1, 0], np.float32)
  out = []
  for rows in (8, 4):
    lrn = Learner(_model(3), AlgoSpec(), OptimConfig(lr=1e-3), microbatch_size=2,
                  length_multiple=8)
    batch = RolloutBatch(rollouts=tuple(rs), rewards=rewards, trained=np.arange(4),
                         rows=pack_rows(rs, rewards, pad_id=0, rows=rows), group_size=2)
    m, adv = lrn.update(batch)
    out.append((m, adv, jax.tree.leaves(nnx.state(lrn.state.params))))
  (m8, adv8, p8), (m4, adv4, p4) = out
  np.testing.assert_allclose(adv4, adv8, rtol=1e-6)
  for k in ("loss", "pg_loss", "entropy", "grad_norm", "tokens", "response_len"):
    np.testing.assert_allclose(m4[k], m8[k], rtol=1e-5, atol=1e-7, err_msg=k)
  for a, b in zip(p4, p8):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["decoupled_ppo", "tis"])
def test_off_policy_correction_uses_the_proximal_policy(data, kind):
  """Rollouts sampled by an older policy mu: the ratio's denominator becomes the
  learner's own pre-update logprobs, each token is weighted by pi_prox / mu (dropped
  past the cap for decoupled PPO, truncated for TIS), and the step's loss and weight
  metrics equal those values computed by hand."""
  tokens, attn, lm = data
  cap = 1.5
  spec = AlgoSpec(loss_agg="token_mean", off_policy=kind, importance_cap=cap)
  lrn = Learner(_model(), spec, OptimConfig(lr=1e-3), microbatch_size=4)
  plain = Learner(_model(), AlgoSpec(loss_agg="token_mean"), OptimConfig(lr=1e-3),
                  microbatch_size=4)
  prox_rows = lrn.logprobs(tokens, attn, lm)
  rng = np.random.default_rng(7)
  behav_rows = ((prox_rows + rng.normal(scale=0.4, size=prox_rows.shape)) * lm).astype(np.float32)
  rewards = np.arange(B, dtype=np.float32)
  batch = lrn.prepare(tokens, attn, lm, behav_rows, rewards, group_size=4, pad_multiple=1)
  ref = plain.prepare(tokens, attn, lm, behav_rows, rewards, group_size=4, pad_multiple=1)
  m = np.asarray(batch.loss_mask, np.float32)
  prox, behav = np.asarray(lrn.batch_logprobs(batch)), np.asarray(ref.old_logprobs)
  np.testing.assert_allclose(np.asarray(batch.old_logprobs), prox, atol=1e-6)
  w = np.where(m > 0, np.exp(prox - behav), 1.0)
  np.testing.assert_allclose(np.asarray(batch.importance), w, rtol=1e-5)
  assert ((w > cap) & (m > 0)).any() and ((w < 1) & (m > 0)).any()  # both tails present
  applied = (np.where(w > cap, 0.0, w) if kind == "decoupled_ppo" else np.minimum(w, cap)) * m
  adv = np.asarray(batch.advantages)
  got = metrics_to_host(lrn.step(batch))
  # at theta = pi_prox the clipped ratio is 1: the loss is -sum(applied * A) / tokens
  assert got["pg_loss"] == pytest.approx(-(applied * adv).sum() / m.sum(), rel=1e-4, abs=1e-6)
  assert got["iw_mean"] == pytest.approx((w * m).sum() / m.sum(), rel=1e-5)
  assert got["iw_max"] == pytest.approx(w[m > 0].max(), rel=1e-5)
  assert got["iw_min"] == pytest.approx(w[m > 0].min(), rel=1e-5)
  assert got["iw_capped_frac"] == pytest.approx(((w > cap) & (m > 0)).sum() / m.sum())
  assert "iw_mean" not in metrics_to_host(plain.step(ref))


def test_a_tempered_rollout_is_scored_under_the_distribution_that_sampled_it():
  """rollout.temperature T != 1: the engine samples softmax(logits / T); the rollouts
  carry that distribution's logprobs and a learner with AlgoSpec(temperature=T) scores
  them the same (on-policy: gap ~ 0, ratio 1), where a learner at T = 1 would not."""
  from rlpt.models.tokenizer import CharTokenizer
  from rlpt.rollout import GenerateRequest, JaxEngine, JaxEngineConfig, SamplingParams
  from rlpt.train.batch import pack_rows
  from rlpt.train.scheduler import to_rollouts
  from rlpt.types import Task

  tok = CharTokenizer(sorted(set("0123456789+= ")))
  cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                    eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
  model = Decoder(cfg, rngs=nnx.Rngs(5))
  engine = JaxEngine(model, tok, JaxEngineConfig(max_batch=8, max_len=64, kv_cache_mib=8,
                                                 min_prompt_bucket=16, length_multiple=16))
  tasks = [Task("synthetic", p) for p in ("1+2=", "33+4=")]
  T = 1.7
  sp = SamplingParams(max_new_tokens=6, temperature=T, seed=3, ignore_eos=True)
  comps = engine.generate([GenerateRequest(prompt_ids=tuple(tok.encode(t.prompt)), n=4,
                                           sampling=sp) for t in tasks])
  rewards = np.array([1, 0, 0, 1, 0, 1, 1, 0], np.float32)

  def gap(rollout_temperature, learner_temperature):
    rs = to_rollouts(tasks, comps, n=4, temperature=rollout_temperature)
    rows = pack_rows(rs, rewards, pad_id=0, length_multiple=8)
    lrn = Learner(model, AlgoSpec(temperature=learner_temperature), OptimConfig(lr=1e-3),
                  microbatch_size=8)
    batch = lrn.prepare(rows.tokens, rows.attention_mask, rows.loss_mask, rows.old_logprobs,
                        rows.rewards, group_size=4, pad_multiple=8)
    return metrics_to_host(lrn.step(batch)), rs

  m, rs = gap(T, T)
  np.testing.assert_allclose(rs[0].logprobs, comps[0].sampling_logprobs)
  assert m["logprob_gap_max"] < 1e-4 and m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
  m1, rs1 = gap(1.0, 1.0)            # the policy's own logprobs, scored at T = 1: also exact
  np.testing.assert_allclose(rs1[0].logprobs, comps[0].logprobs)
  assert m1["logprob_gap_max"] < 1e-4
  wrong, _ = gap(T, 1.0)            # tempered logprobs against the T = 1 policy: off
  assert wrong["logprob_gap_max"] > 0.05
  with pytest.raises(ValueError, match="temperature"):
    AlgoSpec(temperature=0.0)


def test_bf16_learner_steps_on_cpu_with_fp32_master_weights(data):
  """compute dtype bfloat16: the step runs on XLA:CPU (bf16 dots emulated, see
  rlpt.ops.dots), parameters and optimizer state stay fp32, and two steps land within
  bf16's precision of the fp32 learner's."""
  tokens, attn, lm = data
  out = {}
  for dtype in ("float32", "bfloat16"):
    lrn = Learner(Decoder(CFG.replace(dtype=dtype), rngs=nnx.Rngs(0)),
                  AlgoSpec(loss_agg="token_mean"), OptimConfig(lr=1e-2), microbatch_size=4)
    old = lrn.logprobs(tokens, attn, lm)
    rewards = np.arange(B, dtype=np.float32) % 2
    batch = lrn.prepare(tokens, attn, lm, old, rewards, group_size=4, pad_multiple=1)
    metrics = [metrics_to_host(lrn.step(batch)) for _ in range(2)]
    assert all(x.dtype in (jnp.float32, jnp.int32) for x in jax.tree.leaves(lrn.state))
    assert all(np.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in metrics)
    out[dtype] = (old, jax.tree.leaves(lrn.state.params), metrics)
  (lp32, p32, m32), (lp16, p16, m16) = out["float32"], out["bfloat16"]
  gap = np.abs(lp16 - lp32)[lm]
  assert 0 < gap.max() < 0.01, gap.max()         # bf16 really ran, and is close (9e-4)
  # Adam moves a weight by about lr whatever its gradient's size, so weights whose
  # gradient is near 0 may step either way: compare the updates as vectors (measured
  # 2-12 % apart per parameter, correlation >= 0.993).
  init = jax.tree.leaves(nnx.state(Decoder(CFG, rngs=nnx.Rngs(0)), nnx.Param))
  for a, b, i in zip(p32, p16, init):
    assert b.dtype == jnp.float32
    d32, d16 = np.asarray(a - i).ravel(), np.asarray(b - i).ravel()
    assert np.linalg.norm(d16 - d32) < 0.25 * np.linalg.norm(d32)
  np.testing.assert_allclose(m16[0]["grad_norm"], m32[0]["grad_norm"], rtol=0.02)
