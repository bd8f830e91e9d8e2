"""The learner: one jitted, sharded policy-gradient update per batch of rollouts.

    learner = Learner(model, settings.rl.algo, settings.rl.optim, microbatch_size=8, mesh=mesh)
    metrics, advantages = learner.update(rollout_batch)   # the RL step's second stage

`update` takes the collector's RolloutBatch (rlpt.train.batch), checks that its rows
are within `max_staleness` weight versions of the learner, packs them once
(`prepare`), runs one optimizer step (`step`) and returns host metrics and each
trained row's mean advantage. The pieces also work alone:

    batch = learner.prepare(tokens, attention_mask, loss_mask, rollout_logprobs,
                            rewards, group_size=n)
    metrics = learner.step(batch)       # dispatched; device arrays, nothing blocks
    ...                                 # dispatch step t+1, then read step t:
    host = metrics_to_host(metrics)     # {"loss": float, ...}

State (`learner.state`, a `TrainState` pytree; what a checkpoint saves): the policy
parameters as an `nnx.State` (float32), the Optax state and the step counter. The
frozen reference parameters (`learner.ref_params`, for KL) are a copy of the initial
policy. The update is a pure function of (graphdef, state, batch): `nnx.split` once,
`nnx.merge` inside the jitted step; the state is donated.

Batch layout (`Batch`, rlpt.train.packing): `prepare` takes the rollout batch row by
row ([B, T] tokens = prompt + completion, `loss_mask` on completion tokens,
the engine's logprobs aligned with tokens) and packs it so that each group's shared
prompt runs through the decoder once (sequence-level fields [S, Tp]) and every
per-token quantity lives in a completion window (row-level fields [B, Tc]):
`targets[b, j]` is scored by the hidden state at `src[b, j]` of sequence b // (B / S).
`old_logprobs` are the rollout engine's logprobs of the targets. The importance
ratio is exp(learner logprob - old_logprobs): 1 up to numerics when the engine ran
the same weights. Rows of a group must be consecutive (B = G * n).

The step splits the batch into microbatches of whole sequences (about
`microbatch_size` rows each) and accumulates gradients over them in a `lax.scan`;
the aggregation weights come from the full batch (rlpt.algorithms.losses), so the
accumulated gradient equals the full-batch one.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from rlpt.algorithms import advantages as adv_lib
from rlpt.algorithms import kl as kl_lib
from rlpt.algorithms import losses as loss_lib
from rlpt.algorithms import off_policy as off_policy_lib
from rlpt.algorithms.spec import AlgoSpec
from rlpt.models import sharding as sharding_lib
from rlpt.models.decoder import Decoder, forward
from rlpt.models.logprobs import chunked_logprobs
from rlpt.train import distributed, packing
from rlpt.train.optim import OptimConfig, init_state, make_optimizer, make_schedule

BATCH_AXES = sharding_lib.LOGICAL_RULES["batch"]


class TrainState(NamedTuple):
  """params: nnx.State of the policy; opt_state: Optax state of (params, value_head);
  step: int32[]; value_head: {"w": float32[D], "b": float32[]} for PPO, else None."""

  params: Any
  opt_state: Any
  step: jax.Array
  value_head: Any = None


class Batch(NamedTuple):
  """One update's data in the packed layout (see the module docstring): the first three
  fields are per sequence [S, Tp], the rest per row [B, Tc]."""

  tokens: jax.Array          # int32[S, Tp] prompts once, then each row's continuation
  positions: jax.Array       # int32[S, Tp] RoPE positions (a continuation's as in its row)
  segments: jax.Array        # int32[S, Tp] 0 prompt, i + 1 row i's continuation, -1 pad
  src: jax.Array             # int32[B, Tc] position in the row's sequence predicting targets
  targets: jax.Array         # int32[B, Tc]
  loss_mask: jax.Array       # bool[B, Tc], scored completion tokens
  old_logprobs: jax.Array    # float32[B, Tc], the ratio's denominator: the rollout engine's
                             # (off_policy "none") or the learner's pre-update (proximal)
  advantages: jax.Array      # float32[B, Tc]
  ref_logprobs: jax.Array    # float32[B, Tc], the frozen reference's (zeros without KL)
  old_values: jax.Array      # float32[B, Tc], value head at rollout time (PPO; else zeros)
  returns: jax.Array         # float32[B, Tc], advantages + old_values (PPO; else zeros)
  importance: jax.Array      # float32[B, Tc], pi_prox / mu on loss tokens (1 without
                             # off-policy correction; rlpt.algorithms.off_policy)


SEQ_FIELDS = ("tokens", "positions", "segments")


def logprobs_and_entropy(model: Decoder, tokens, positions, segments, src, targets, *,
                         chunk_size: int = 256, with_entropy: bool = True, value_head=None,
                         temperature: float = 1.0):
  """(logprobs, entropy, values), float32[B, Tc] each, in the packed layout.

  Inputs as in `Batch`: tokens/positions/segments [S, Tp], src/targets [B, Tc] with
  B a multiple of S. logprobs[b, j] = log p(targets[b, j] | what precedes it), read from
  the hidden state h[b // (B/S), src[b, j]]; entropy[b, j] is the entropy of that
  next-token distribution; values[b, j] = h . w + b, the value head (PPO) on the same
  hidden state (zeros when `value_head` is None). Logits are divided by `temperature`
  (the policy trained is softmax(logits / T); AlgoSpec.temperature).

  The vocabulary projection is `rlpt.models.logprobs.chunked_logprobs` (`chunk_size`
  window positions at a time). Entropy carries no gradient unless entropy_coef > 0
  (see `_loss`).
  """
  cfg = model.config
  params = model.arrays()
  S = tokens.shape[0]
  B, n = src.shape
  r = B // S
  h = forward(cfg, params, tokens, positions=positions, segment_ids=segments,
              return_hidden=True)                                    # [S, Tp, D]
  h = jax.vmap(lambda hs, idx: hs[idx])(h, src.reshape(S, r * n)).reshape(B, n, -1)
  values = (jnp.zeros((B, n), jnp.float32) if value_head is None
            else h @ value_head["w"] + value_head["b"])
  lp, ent = chunked_logprobs(cfg, params, h, targets, chunk_size=chunk_size,
                             with_entropy=with_entropy, temperature=temperature)
  return lp, ent, values


def _loss(trainable, graphdef, spec: AlgoSpec, chunk_size: int, mb: Batch, weights):
  """Loss of one microbatch (sum of weights * per-token terms) and its statistics.
  trainable: (policy params, value head or None)."""
  params, value_head = trainable
  model = nnx.merge(graphdef, params)
  lp, ent, values = logprobs_and_entropy(model, mb.tokens, mb.positions, mb.segments, mb.src,
                                         mb.targets, chunk_size=chunk_size,
                                         value_head=value_head, temperature=spec.temperature)
  m = mb.loss_mask.astype(jnp.float32)
  lp = lp * m
  pg_tok, clipped = loss_lib.policy_loss(
      spec.policy_loss, lp, mb.old_logprobs, mb.advantages, m, eps_low=spec.clip_eps_low,
      eps_high=spec.clip_eps_high, dual_clip_c=spec.dual_clip_c)
  if spec.corrects_off_policy:
    pg_tok = pg_tok * off_policy_lib.applied_weights(spec.off_policy, mb.importance, m,
                                                     cap=spec.importance_cap)
  pg = jnp.sum(weights * pg_tok)
  kl_tok = kl_lib.kl_estimate(spec.kl_estimator, lp, mb.ref_logprobs) * m
  loss = pg
  if spec.kl_in == "loss" and spec.kl_coef > 0:
    loss = loss + spec.kl_coef * jnp.sum(weights * kl_tok)
  vf = jnp.zeros(())
  if value_head is not None:
    vf = jnp.sum(weights * loss_lib.value_loss(values, mb.old_values, mb.returns, m,
                                               clip=spec.value_clip))
    loss = loss + spec.value_coef * vf
  ent = ent * m
  if spec.entropy_coef > 0:
    loss = loss - spec.entropy_coef * jnp.sum(weights * ent)
  else:
    ent = jax.lax.stop_gradient(ent)
  lp_sg = jax.lax.stop_gradient(lp)
  kl_tok = kl_tok if spec.uses_reference else jnp.zeros_like(kl_tok)
  approx_kl = kl_lib.k3(lp_sg, mb.old_logprobs) * m  # KL(rollout policy || learner)
  gap = jnp.abs(lp_sg - mb.old_logprobs) * m
  ratio = jnp.exp(jax.lax.stop_gradient(lp) - mb.old_logprobs) * m
  stats = dict(loss=loss, pg_loss=pg, value_loss=vf, tokens=m.sum(), clipped=clipped.sum(),
               kl=jax.lax.stop_gradient(kl_tok).sum(), entropy=jax.lax.stop_gradient(ent).sum(),
               ratio=ratio.sum(), approx_kl=approx_kl.sum(), logprob_gap_max=gap.max(),
               sequences=(m.sum(axis=1) > 0).sum().astype(jnp.float32))
  return loss, stats


def _microbatches(x, n_micro):
  """[N, ...] -> [n_micro, N / n_micro, ...], microbatch i = items i, i + n_micro, ...
  (each microbatch keeps the batch axis spread over the devices)."""
  b = x.shape[0]
  return x.reshape(b // n_micro, n_micro, *x.shape[1:]).swapaxes(0, 1)


def _split(batch: Batch, weights, n_micro: int):
  """Microbatches of whole sequences: sequence-level fields split over S, row-level
  fields (and the loss weights) over the same sequences' rows."""
  S, B = batch.tokens.shape[0], batch.src.shape[0]
  r = B // S
  def rows(x):  # [B, Tc] -> [S, r, Tc] -> split over S -> [n_micro, B / n_micro, Tc]
    y = _microbatches(x.reshape(S, r, *x.shape[1:]), n_micro)
    return y.reshape(n_micro, B // n_micro, *x.shape[1:])
  mb = Batch(*[_microbatches(x, n_micro) if f in SEQ_FIELDS else rows(x)
               for f, x in zip(Batch._fields, batch)])
  return mb, rows(weights)


def num_microbatches(n_rows: int, n_seqs: int, microbatch_size: int) -> int:
  """Microbatches for a batch of `n_rows` rows in `n_seqs` sequences: n_rows /
  microbatch_size, fewer when a sequence's rows would have to be split."""
  mbs = min(microbatch_size, n_rows)
  if n_rows % mbs:
    raise ValueError(f"batch of {n_rows} rows is not a multiple of "
                     f"config.rl.microbatch_size = {mbs}")
  return int(np.gcd(n_rows // mbs, n_seqs))


def loss_and_grads(graphdef, spec: AlgoSpec, n_micro: int, chunk_size: int, params,
                   batch: Batch, value_head=None):
  """Gradient of the full-batch loss, accumulated over `n_micro` microbatches.

  Returns (grads like (params, value_head), summed statistics of `_loss`;
  logprob_gap_max is a max).
  """
  weights = loss_lib.loss_weights(spec.loss_agg, batch.loss_mask,
                                  constant=spec.loss_agg_constant or None)
  mbs = _split(batch, weights, n_micro)
  grad_fn = jax.value_and_grad(_loss, has_aux=True)

  def one(carry, mb_w):
    grads, stats = carry
    mb, w = mb_w
    (_, s), g = grad_fn((params, value_head), graphdef, spec, chunk_size, mb, w)
    grads = jax.tree.map(jnp.add, grads, g)
    stats = {k: (jnp.maximum(stats[k], v) if k.endswith("_max") else stats[k] + v)
             for k, v in s.items()}
    return (grads, stats), None

  init = (jax.tree.map(jnp.zeros_like, (params, value_head)),
          {k: jnp.zeros((), jnp.float32) for k in STAT_KEYS})
  (grads, stats), _ = jax.lax.scan(one, init, mbs)
  return grads, stats


STAT_KEYS = ("loss", "pg_loss", "value_loss", "tokens", "clipped", "kl", "entropy", "ratio",
             "approx_kl", "logprob_gap_max", "sequences")


def train_step(graphdef, tx, spec: AlgoSpec, n_micro: int, chunk_size: int,
               state: TrainState, batch: Batch):
  """The pure update: (state, batch) -> (new state, metrics dict of float32 scalars)."""
  grads, s = loss_and_grads(graphdef, spec, n_micro, chunk_size, state.params, batch,
                            state.value_head)
  grad_norm = optax.tree.norm(grads)
  trainable = (state.params, state.value_head)
  updates, opt_state = tx.update(grads, state.opt_state, trainable)
  params, value_head = optax.apply_updates(trainable, updates)
  ntok = jnp.maximum(s["tokens"], 1.0)
  metrics = dict(loss=s["loss"], pg_loss=s["pg_loss"], value_loss=s["value_loss"],
                 clip_frac=s["clipped"] / ntok,
                 kl=s["kl"] / ntok, approx_kl=s["approx_kl"] / ntok,
                 entropy=s["entropy"] / ntok, grad_norm=grad_norm,
                 ratio_mean=s["ratio"] / ntok, logprob_gap_max=s["logprob_gap_max"],
                 response_len=s["tokens"] / jnp.maximum(s["sequences"], 1.0),
                 tokens=s["tokens"],
                 adv_mean=jnp.sum(batch.advantages * batch.loss_mask) / ntok)
  if spec.corrects_off_policy:
    metrics.update(off_policy_lib.weight_stats(spec.off_policy, batch.importance,
                                               batch.loss_mask, cap=spec.importance_cap))
  return TrainState(params, opt_state, state.step + 1, value_head), metrics


def metrics_to_host(metrics: dict[str, jax.Array]) -> dict[str, float]:
  """Blocks on one step's metrics and converts them to Python floats."""
  return {k: float(v) for k, v in jax.device_get(metrics).items()}


class Learner:
  """Holds the TrainState and the jitted step; see the module docstring."""

  def __init__(self, model: Decoder, spec: AlgoSpec, optim: OptimConfig, *,
               microbatch_size: int, mesh: jax.sharding.Mesh | None = None,
               chunk_size: int = 256, share_prompts: bool = True, length_multiple: int = 64,
               max_staleness: int = 0, window_multiple: int = 8):
    if microbatch_size < 1:
      raise ValueError(f"config.rl.microbatch_size = {microbatch_size}: expected >= 1")
    self.spec, self.optim, self.mesh = spec, optim, mesh
    self.microbatch_size, self.chunk_size = microbatch_size, chunk_size
    self.share_prompts = share_prompts
    self.length_multiple, self.max_staleness = length_multiple, max_staleness
    # the scored window (packing.Packed's Tc) is padded to a multiple of this: long,
    # varied completions (multi-turn episodes) want a coarse one, or each new length
    # compiles the step again
    self.window_multiple = window_multiple
    # The weight version of the current parameters: `update` calls so far (a skipped
    # update publishes the same parameters as the next version too); a resumed run sets
    # it to the restored step.
    self.version = 0
    self.graphdef, params = nnx.split(model)
    params = jax.tree.map(jnp.copy, params)  # the step donates its state: keep `model` intact
    self.tx = make_optimizer(optim)
    self._schedule = make_schedule(optim)
    if mesh is not None:
      self._param_sh = sharding_lib.state_shardings(params, mesh)
      params = jax.device_put(params, self._param_sh)
      batch_axes = tuple(a for a in BATCH_AXES if a in mesh.shape)
      self._rows = NamedSharding(mesh, P(batch_axes))
      # sequence-level fields [S, Tp]: the packed sequence split over "seq" as well
      # (ring attention, rlpt.ops.ring_attention) when the mesh has that axis
      self._seqs = NamedSharding(mesh, P(batch_axes, "seq") if self.seq_shards > 1
                                 else P(batch_axes))
      self._repl = NamedSharding(mesh, P())
    value_head = None
    if spec.uses_values:  # PPO: a linear value head on the policy's final hidden state
      value_head = {"w": jnp.zeros((model.config.hidden_size,), jnp.float32),
                    "b": jnp.zeros((), jnp.float32)}
    if mesh is not None and value_head is not None:  # replicated, as the state keeps it
      value_head = jax.device_put(value_head, self._repl)
    opt_state = (jax.jit(self.tx.init)((params, value_head)) if mesh is None else
                 init_state(self.tx, (params, value_head), rest=self._repl))
    self.state = TrainState(params, opt_state, jnp.zeros((), jnp.int32), value_head)
    if mesh is None:  # committed, as the step's outputs are: the second step must not recompile
      self.state = jax.tree.map(lambda x: jax.device_put(x, x.sharding), self.state)
    else:  # counters and scalars: replicated over the mesh
      on_mesh = lambda x: (isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh)
      self.state = jax.tree.map(lambda x: x if on_mesh(x) else jax.device_put(x, self._repl),
                                self.state)
    self.ref_params = (jax.tree.map(jnp.copy, params) if spec.uses_reference else None)
    self._steps: dict[int, Any] = {}
    self._lp_fn = self._in_mesh(jax.jit(self._logprobs_fn))
    self._v_fn = self._in_mesh(jax.jit(self._values_fn))
    self._prepare = self._in_mesh(jax.jit(self._prepare_fn, static_argnames=("group_size",)))

  # ------------------------------------------------------------------ helpers

  @property
  def seq_shards(self) -> int:
    """Devices each packed sequence is split over (the mesh's "seq" axis; 1 = none)."""
    return 1 if self.mesh is None else int(self.mesh.shape.get("seq", 1))

  def _in_mesh(self, fn):
    """`fn` called under `jax.set_mesh(self.mesh)` when the mesh splits sequences: the
    decoder reads the context mesh while tracing and runs attention as a ring over
    "seq" (rlpt.models.decoder.forward)."""
    if self.seq_shards == 1:
      return fn
    mesh = self.mesh

    @functools.wraps(fn)
    def call(*args, **kwargs):
      with jax.set_mesh(mesh):
        return fn(*args, **kwargs)
    return call

  def model(self, params=None) -> Decoder:
    """The policy as an nnx module over the current (or given) parameters."""
    return nnx.merge(self.graphdef, self.state.params if params is None else params)

  def _logprobs_fn(self, params, tokens, positions, segments, src, targets, loss_mask):
    lp, _, _ = logprobs_and_entropy(nnx.merge(self.graphdef, params), tokens, positions,
                                    segments, src, targets, chunk_size=self.chunk_size,
                                    with_entropy=False, temperature=self.spec.temperature)
    return lp * loss_mask

  def _values_fn(self, params, value_head, tokens, positions, segments, src, targets, loss_mask):
    _, _, v = logprobs_and_entropy(nnx.merge(self.graphdef, params), tokens, positions,
                                   segments, src, targets, chunk_size=self.chunk_size,
                                   with_entropy=False, value_head=value_head)
    return v * loss_mask

  def batch_logprobs(self, batch: Batch, *, params=None):
    """float32[B, Tc] logprobs of `batch.targets` under `params` (default: the current
    policy), 0 off the loss mask: what `batch.old_logprobs` holds when on-policy."""
    return self._lp_fn(self.state.params if params is None else params, batch.tokens,
                       batch.positions, batch.segments, batch.src, batch.targets,
                       batch.loss_mask)

  def batch_values(self, batch: Batch):
    """float32[B, Tc] the value head (PPO) under the current state, 0 off the loss mask."""
    return self._v_fn(self.state.params, self.state.value_head, batch.tokens, batch.positions,
                      batch.segments, batch.src, batch.targets, batch.loss_mask)

  def logprobs(self, tokens, attention_mask, loss_mask, *, params=None) -> np.ndarray:
    """float32[B, T] token logprobs in the row layout (as rlpt.models.token_logprobs:
    out[b, t] scores tokens[b, t], 0 off `loss_mask`) under `params` (default: the
    current policy)."""
    tokens = np.asarray(tokens)
    pk = self._pack(tokens, attention_mask, loss_mask, group_size=1, pad_multiple=16)
    seq, rows = self._device_batch(pk)
    lp = self._lp_fn(self.state.params if params is None else params, *seq, *rows)
    return pk.to_rows(distributed.host_value(lp), tokens.shape[1])

  def _seq_divisor(self) -> int:
    if self.mesh is None:
      return 1
    return int(np.prod([self.mesh.shape[a] for a in BATCH_AXES if a in self.mesh.shape]))

  def _pack(self, tokens, attention_mask, loss_mask, *, group_size, pad_multiple):
    # ring attention's zigzag layout splits a sequence into 2 x seq equal chunks
    pad_multiple = int(np.lcm(pad_multiple, 2 * self.seq_shards))
    return packing.pack(tokens, attention_mask, loss_mask, group_size=group_size,
                        share_prompts=self.share_prompts, length_multiple=pad_multiple,
                        window_multiple=self.window_multiple, seq_divisor=self._seq_divisor())

  def _device_batch(self, pk: packing.Packed):
    """((tokens, positions, segments), (src, targets, loss_mask)) on the devices."""
    seq = self._put(self._seqs if self.mesh is not None else None,
                    pk.tokens, pk.positions, pk.segments)
    rows = self._put_rows(pk.src, pk.targets, pk.loss_mask)
    return seq, rows

  def _put_rows(self, *xs):
    return self._put(self._rows if self.mesh is not None else None, *xs)

  @staticmethod
  def _put(sharding, *xs):
    if sharding is None:
      return tuple(jnp.asarray(x) for x in xs)
    return tuple(Learner._put_one(x, sharding) for x in xs)

  @staticmethod
  def _put_one(x, sharding):
    if isinstance(x, jax.Array):
      return x if x.sharding == sharding else jax.device_put(x, sharding)
    # a host array every process holds whole: each process places its devices' shards
    return distributed.global_array(np.asarray(x), sharding)

  def _prepare_fn(self, ref_lp, values, prox_lp, seq, src, targets, loss_mask, rollout_lp,
                  rewards, *, group_size):
    spec = self.spec
    m = loss_mask.astype(jnp.float32)
    rollout_lp = rollout_lp.astype(jnp.float32) * m
    if spec.corrects_off_policy:
      importance = off_policy_lib.importance_weights(prox_lp, rollout_lp, loss_mask)
      old = prox_lp * m
    else:
      importance, old = jnp.ones_like(m), rollout_lp
    token_rewards = adv_lib.outcome_token_rewards(rewards, loss_mask)
    if spec.kl_in == "reward" and spec.kl_coef > 0:
      kl_tok = kl_lib.kl_estimate(spec.kl_estimator, rollout_lp, ref_lp)
      token_rewards = kl_lib.penalize_rewards(token_rewards, kl_tok, m, spec.kl_coef)
    adv = adv_lib.compute_advantages(spec.advantage, token_rewards, m, group_size=group_size,
                                     values=values if spec.uses_values else None,
                                     gamma=spec.gamma, lam=spec.gae_lambda, eps=spec.adv_eps)
    returns = (adv + values) * m if spec.uses_values else jnp.zeros_like(adv)
    return Batch(*seq, src, targets, loss_mask.astype(bool), old, adv, ref_lp * m, values * m,
                 returns, importance)

  def prepare(self, tokens, attention_mask, loss_mask, rollout_logprobs, rewards, *,
              group_size: int, pad_multiple: int = 64) -> Batch:
    """Builds a Batch from a rollout batch in the row layout: tokens, attention_mask,
    loss_mask, rollout_logprobs [B, T] (logprobs aligned with tokens, as the engine
    returns them), rewards [B]. Packs it (rlpt.train.packing: a group's rows share one
    pass over their prompt when their prompts are identical; sequences padded to a
    multiple of `pad_multiple` so that batches of varying length reuse a few compiled
    steps), then: reference logprobs (when KL is on), outcome rewards placed on the
    last completion token, KL-in-reward if configured, then the configured advantage
    estimator (GAE: on the value head's current values; returns = A + V). With an
    off-policy correction (`spec.off_policy`), the current parameters' logprobs are the
    proximal policy: they become `old_logprobs` and `importance` = pi_prox / mu."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
      raise ValueError(f"Learner.prepare: tokens has shape {tokens.shape}, expected [B, T]")
    b, t = tokens.shape
    arrays = {}
    for name, x in (("attention_mask", attention_mask), ("loss_mask", loss_mask),
                    ("rollout_logprobs", rollout_logprobs)):
      arrays[name] = np.asarray(x)
      if arrays[name].shape != (b, t):
        raise ValueError(f"Learner.prepare: {name} has shape {arrays[name].shape}, expected "
                         f"{(b, t)} like tokens")
    rewards = np.asarray(rewards, np.float32)
    if rewards.shape != (b,):
      raise ValueError(f"Learner.prepare: rewards has shape {rewards.shape}, expected ({b},)")
    pk = self._pack(tokens, arrays["attention_mask"], arrays["loss_mask"],
                    group_size=group_size, pad_multiple=pad_multiple)
    seq, rows = self._device_batch(pk)
    old, rewards = self._put_rows(pk.to_window(arrays["rollout_logprobs"].astype(np.float32)),
                                  rewards)
    shape = pk.src.shape
    ref = (self._lp_fn(self.ref_params, *seq, *rows)
           if self.spec.uses_reference else jnp.zeros(shape, jnp.float32))
    values = (self._v_fn(self.state.params, self.state.value_head, *seq, *rows)
              if self.spec.uses_values else jnp.zeros(shape, jnp.float32))
    prox = (self._lp_fn(self.state.params, *seq, *rows)   # the proximal policy: pre-update
            if self.spec.corrects_off_policy else jnp.zeros(shape, jnp.float32))
    return self._prepare(ref, values, prox, seq, *rows, old, rewards, group_size=group_size)

  def _compiled(self, n_rows: int, n_seqs: int):
    key = (n_rows, n_seqs)
    if key not in self._steps:
      n_micro = num_microbatches(n_rows, n_seqs, self.microbatch_size)
      fn = functools.partial(train_step, self.graphdef, self.tx, self.spec, n_micro,
                             self.chunk_size)
      if self.mesh is None:
        self._steps[key] = jax.jit(fn, donate_argnums=(0,))
      else:
        state_sh = jax.tree.map(lambda x: x.sharding, self.state)
        batch_sh = Batch(*[self._seqs if f in SEQ_FIELDS else self._rows
                           for f in Batch._fields])
        self._steps[key] = self._in_mesh(jax.jit(fn, donate_argnums=(0,),
                                                 in_shardings=(state_sh, batch_sh),
                                                 out_shardings=(state_sh, self._repl)))
    return self._steps[key]

  def step(self, batch: Batch) -> dict[str, jax.Array]:
    """One optimizer update; returns the step's metrics as device scalars (not
    blocking). Metrics: loss, pg_loss, value_loss (PPO), clip_frac, kl (to the reference; 0 without
    one), approx_kl (k3 of the rollout policy to the learner), entropy, grad_norm (before
    clipping), ratio_mean, logprob_gap_max (max |rollout - learner logprob| over
    completion tokens), response_len, tokens, adv_mean, lr; with an off-policy correction
    also iw_mean, iw_min, iw_max and iw_capped_frac (rlpt.algorithms.off_policy)."""
    step_fn = self._compiled(batch.src.shape[0], batch.tokens.shape[0])
    lr = self.learning_rate()
    put = [self._put(self._seqs if f in SEQ_FIELDS else self._rows, x)[0]
           if self.mesh is not None else jnp.asarray(x) for f, x in zip(Batch._fields, batch)]
    self.state, metrics = step_fn(self.state, Batch(*put))
    metrics["lr"] = lr
    return metrics

  def staleness(self, batch) -> np.ndarray:
    """int[K]: how many versions each trained row of `batch` (a RolloutBatch) lags
    behind the learner's current parameters."""
    versions = batch.weight_versions()[batch.trained]
    return self.version - versions

  def update(self, batch) -> tuple[dict[str, float], np.ndarray]:
    """The RL step's learner stage on a collector's RolloutBatch: one optimizer update.

    Returns host metrics (`step`'s, plus staleness, staleness_max and, when
    max_staleness > 0, the histogram staleness/k for k <= max_staleness) and float[K], each
    trained row's mean advantage over its completion tokens. A batch without trained
    rows (dynamic sampling found no group with signal) skips the update:
    {"loss": 0.0, "skipped_update": 1.0}. Raises ValueError when a row is more than
    `max_staleness` versions behind: the collector must never hand the learner such
    a batch.
    """
    if batch.num_trained == 0:
      self.version += 1  # the same parameters, published as the next version
      return {"loss": 0.0, "skipped_update": 1.0}, np.zeros((0,), np.float32)
    lag = self.staleness(batch)
    if lag.max() > self.max_staleness or lag.min() < 0:
      versions = sorted(set((self.version - lag).tolist()))
      raise ValueError(f"Learner.update: rollouts of weight versions {versions} for a "
                       f"learner at version {self.version} (max_staleness = "
                       f"{self.max_staleness})")
    r = batch.rows
    prepared = self.prepare(r.tokens, r.attention_mask, r.loss_mask, r.old_logprobs, r.rewards,
                            group_size=batch.group_size, pad_multiple=self.length_multiple)
    adv, mask = (distributed.host_value(x) for x in (prepared.advantages, prepared.loss_mask))
    per_row = ((adv * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1))[:batch.num_trained]
    metrics = metrics_to_host(self.step(prepared))
    self.version += 1
    metrics.update(staleness=float(lag.mean()), staleness_max=float(lag.max()))
    if self.max_staleness > 0:  # the histogram: fraction of trained rows k versions behind
      metrics.update({f"staleness/{k}": float(np.mean(lag == k))
                      for k in range(self.max_staleness + 1)})
    return metrics, per_row

  def learning_rate(self, step=None):
    """The schedule's learning rate at `step` (default: the next update's)."""
    return self._schedule(self.state.step if step is None else step)
