"""The jitted core of JaxEngine: admitting prompts into decode slots and decoding.

The engine keeps B decode slots. Each slot owns one row of a preallocated KV
cache (`rlpt.models.KVCache`, S slots per row) and one row of `SlotState`. Work
enters a slot through `prefill` (a batch of prompts once, packed several to a row,
a cache-free forward that returns every layer's keys/values) and `install` (which
copies each prompt's keys/values into every slot that samples from it, at slots
0 .. len - 2) and
leaves it when `decode` marks it finished; the host then refills the slot, or, for
a multi-turn episode, continues it with the environment's tokens (`extend`: the
slot's cache is kept, only the new tokens are computed).

Prefill covers each prompt but its last token; the last prompt token is the
first input of the decode loop (written at slot len - 1, its position), so prefill
needs no logits (XLA drops the LM head) and every sampled token comes from the same
one-token step.

Finish codes in `SlotState.finish`: RUNNING (or free), STOP (a stop token), LENGTH
(max_new_tokens reached), ABORT (set by the host).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlpt.models import decoder
from rlpt.rollout import sampling

RUNNING, STOP, LENGTH, ABORT = 0, 1, 2, 3


class SlotState(NamedTuple):
  """Per-slot decode state (B slots, M output positions, NS stop ids).

  Attributes:
    token: int32[B], the next input token of each slot.
    pos: int32[B], its RoPE position.
    active: bool[B], the slot is decoding (occupied and not finished).
    n_gen: int32[B], tokens generated so far.
    max_new: int32[B], the slot's max_new_tokens.
    finish: int32[B], RUNNING / STOP / LENGTH / ABORT.
    temperature, top_p: float32[B]; top_k: int32[B] (see `sampling.sample`).
    seed: uint32[B]; sample_index: int32[B] (PRNG key inputs).
    stop_ids: int32[B, NS], token ids that end the slot (-1 = unused).
    out_tokens: int32[B, M]; out_logp, out_logq: float32[B, M].
  """

  token: jax.Array
  pos: jax.Array
  active: jax.Array
  n_gen: jax.Array
  max_new: jax.Array
  finish: jax.Array
  temperature: jax.Array
  top_p: jax.Array
  top_k: jax.Array
  seed: jax.Array
  sample_index: jax.Array
  stop_ids: jax.Array
  out_tokens: jax.Array
  out_logp: jax.Array
  out_logq: jax.Array


class Admission(NamedTuple):
  """Rows to (re)fill: A entries; slot `rows[a]` takes the prompt of `length[a]`
  tokens whose first length[a] - 1 tokens sit in packed prefill row `src_row[a]`: the
  first `prefix[a]` of them in the row's columns 0 .. prefix[a] - 1 (the row's shared
  prefix, rlpt.rollout.prefill_packing), the rest from column `src_off[a]`; its last
  token is `last[a]`; `rows[a] == B` marks padding (dropped)."""

  rows: jax.Array          # int32[A]
  src_row: jax.Array       # int32[A]
  src_off: jax.Array       # int32[A]
  prefix: jax.Array        # int32[A], 0 when the prompt shares no prefix in its row
  length: jax.Array        # int32[A], >= 1
  last: jax.Array          # int32[A]
  max_new: jax.Array       # int32[A]
  temperature: jax.Array   # float32[A]
  top_p: jax.Array         # float32[A]
  top_k: jax.Array         # int32[A]
  seed: jax.Array          # uint32[A]
  sample_index: jax.Array  # int32[A]
  stop_ids: jax.Array      # int32[A, NS]


def empty_state(batch: int, out_len: int, num_stop: int) -> SlotState:
  """All slots free (every field its own buffer, so the state can be donated)."""
  zi = lambda: jnp.zeros((batch,), jnp.int32)
  zf = lambda: jnp.zeros((batch,), jnp.float32)
  return SlotState(token=zi(), pos=zi(), active=jnp.zeros((batch,), bool), n_gen=zi(),
                   max_new=zi(), finish=zi(), temperature=zf(),
                   top_p=jnp.ones((batch,), jnp.float32), top_k=zi(),
                   seed=jnp.zeros((batch,), jnp.uint32), sample_index=zi(),
                   stop_ids=jnp.full((batch, num_stop), -1, jnp.int32),
                   out_tokens=jnp.zeros((batch, out_len), jnp.int32),
                   out_logp=jnp.zeros((batch, out_len), jnp.float32),
                   out_logq=jnp.zeros((batch, out_len), jnp.float32))


def _prefill(cfg, params, tokens_RxP, segments_RxP, positions_RxP):
  """Keys and values of every token of packed prompts, per layer [L, R, P, K, Dh]
  (a cache-free forward; `install` then copies them into the slots).

  Args:
    cfg, params: the model (`Decoder.config`, `Decoder.arrays()`).
    tokens_RxP: int32[R, P] prefill rows, each holding several prompts (all tokens
      but their last) one after another; P may exceed the cache length S (each
      prompt's own length + max_new fits S).
    segments_RxP: int32[R, P], a distinct id >= 1 per prompt, 0 for a prefix the
      row's prompts share (held once, at its start), -1 for padding: a token attends
      to earlier tokens of its own prompt and of the row's shared prefix.
    positions_RxP: int32[R, P], each token's position within its prompt.
  """
  _, (new_k, new_v) = decoder.forward(cfg, params, tokens_RxP, positions=positions_RxP,
                                      segment_ids=segments_RxP, return_hidden=True,
                                      return_kv=True)
  return new_k, new_v


#: The prefill, compiled once per row shape [R, P] (JaxEngine runs it and `install` as
#: two programs, so a new slot count or cache length recompiles only the install).
#: Traced under a context mesh with a "seq" axis (`with jax.set_mesh(mesh)`) it is
#: ring attention.
prefill = jax.jit(_prefill, static_argnums=0)


def _install(cache: decoder.KVCache, state: SlotState, new_k, new_v, adm: Admission):
  """Writes prefilled keys/values ([L, R, P, K, Dh], from `prefill`) into the slots
  `adm.rows` of the cache (L layers of [B, K, S, Dh]) and starts those slots: returns
  (cache, state) with them active, n_gen 0."""
  P = new_k.shape[2]
  S = cache.valid.shape[1]
  W = min(P, S)  # a prompt of n tokens fills slots 0 .. n-2, and n + max_new <= S
  rows, lens = adm.rows, adm.length
  # Each admission's W packed columns: its row's shared prefix, then its own tokens
  # from its offset (past the row's end: clamped; those slots are >= its length - 1,
  # so never valid), per layer [A, K, W, Dh].
  j = jnp.arange(W, dtype=jnp.int32)[None]
  pre = adm.prefix[:, None]
  cols = jnp.minimum(jnp.where(j < pre, j, adm.src_off[:, None] + j - pre), P - 1)
  put_kv = lambda c, new: c.at[rows, :, :W].set(  # noqa: E731
      new[adm.src_row[:, None], cols].transpose(0, 2, 1, 3).astype(c.dtype), mode="drop")
  k = tuple(put_kv(c, new_k[i]) for i, c in enumerate(cache.k))
  v = tuple(put_kv(c, new_v[i]) for i, c in enumerate(cache.v))
  valid_rows = jnp.arange(S)[None, :] < (lens - 1)[:, None]
  valid = cache.valid.at[rows].set(valid_rows, mode="drop")
  index = cache.index.at[rows].set(lens - 1, mode="drop")
  put = lambda arr, val: arr.at[rows].set(val, mode="drop")  # noqa: E731
  state = state._replace(
      token=put(state.token, adm.last), pos=put(state.pos, lens - 1),
      active=put(state.active, True), n_gen=put(state.n_gen, 0),
      max_new=put(state.max_new, adm.max_new), finish=put(state.finish, RUNNING),
      temperature=put(state.temperature, adm.temperature), top_p=put(state.top_p, adm.top_p),
      top_k=put(state.top_k, adm.top_k), seed=put(state.seed, adm.seed),
      sample_index=put(state.sample_index, adm.sample_index),
      stop_ids=put(state.stop_ids, adm.stop_ids))
  return decoder.KVCache(k=k, v=v, valid=valid, index=index), state


#: Keys/values prefilled by `prefill` into the cache (cache and state donated).
install = jax.jit(_install, donate_argnums=(0, 1))


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(2, 3))
def extend(cfg: decoder.ModelConfig, params, cache: decoder.KVCache, state: SlotState,
           rows_A: jax.Array, tokens_AxT: jax.Array, n_A: jax.Array, next_A: jax.Array,
           max_new_A: jax.Array, seed_A: jax.Array):
  """Continues finished slots with new input tokens (a multi-turn episode's
  environment turn), reusing their KV cache: no re-prefill of the history.

  Slot rows_A[a] (B = padding, dropped) stopped with its last sampled token as
  `state.token` at `state.pos`, not yet in the cache. Its input goes on with
  tokens_AxT[a, :n_A[a]] = [that token, e_1 .. e_{k-1}] (n = k), written to the cache
  at positions pos .. pos + k - 1 in one cached forward over the A rows alone (their
  cache rows gathered, then scattered back), and e_k (`next_A`) becomes the next
  input at pos + k: the slot decodes again, n_gen 0, with `max_new_A` and `seed_A`.
  """
  B = state.token.shape[0]
  _, T = tokens_AxT.shape
  rows = jnp.minimum(rows_A, B - 1)  # padding reads some row, and writes nothing back
  pos = state.pos[rows]
  tokens_AxT = tokens_AxT.at[:, 0].set(state.token[rows])
  mask = jnp.arange(T)[None, :] < n_A[:, None]
  sub = decoder.KVCache(k=tuple(c[rows] for c in cache.k), v=tuple(c[rows] for c in cache.v),
                        valid=cache.valid[rows], index=pos)
  _, sub = decoder.forward(cfg, params, tokens_AxT, positions=pos[:, None] + jnp.arange(T)[None],
                           attention_mask=mask, cache=sub)
  put = lambda arr, val: arr.at[rows_A].set(val, mode="drop")  # noqa: E731
  cache = decoder.KVCache(k=tuple(put(c, n) for c, n in zip(cache.k, sub.k)),
                          v=tuple(put(c, n) for c, n in zip(cache.v, sub.v)),
                          valid=put(cache.valid, sub.valid), index=put(cache.index, pos + n_A))
  state = state._replace(
      token=put(state.token, next_A), pos=put(state.pos, pos + n_A),
      active=put(state.active, True), n_gen=put(state.n_gen, 0),
      max_new=put(state.max_new, max_new_A), finish=put(state.finish, RUNNING),
      seed=put(state.seed, seed_A))
  return cache, state


def decode_step(cfg: decoder.ModelConfig, params, cache: decoder.KVCache, state: SlotState):
  """One token for every active slot: forward, sample, record, check stops."""
  B, M = state.out_tokens.shape
  logits, cache = decoder.forward(cfg, params, state.token[:, None], positions=state.pos[:, None],
                                  attention_mask=state.active[:, None], cache=cache)
  keys = sampling.sample_row_keys(state.seed, state.sample_index, state.n_gen)
  tok, logp, logq = sampling.sample(logits[:, 0], keys, state.temperature, state.top_p,
                                    state.top_k)
  col = jnp.where(state.active, state.n_gen, M)  # inactive rows write out of range: dropped
  rows = jnp.arange(B)
  n_gen = state.n_gen + state.active.astype(jnp.int32)
  hit_stop = jnp.any(tok[:, None] == state.stop_ids, axis=1)
  at_len = n_gen >= state.max_new
  done = state.active & (hit_stop | at_len)
  finish = jnp.where(done, jnp.where(hit_stop, STOP, LENGTH), state.finish)
  state = state._replace(
      token=jnp.where(state.active, tok, state.token),
      pos=state.pos + state.active.astype(jnp.int32), active=state.active & ~done,
      n_gen=n_gen, finish=finish,
      out_tokens=state.out_tokens.at[rows, col].set(tok, mode="drop"),
      out_logp=state.out_logp.at[rows, col].set(logp, mode="drop"),
      out_logq=state.out_logq.at[rows, col].set(logq, mode="drop"))
  return cache, state


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(2, 3))
def decode(cfg: decoder.ModelConfig, params, cache: decoder.KVCache, state: SlotState,
           max_steps: jax.Array, exit_free: jax.Array):
  """Decodes until no slot is active, `max_steps` steps ran, or at least
  `exit_free` slots are free (so the host can refill them with waiting work).

  Returns (cache, state, steps run). max_steps and exit_free are traced scalars:
  changing them never recompiles.
  """

  def cond(c):
    _, st, step = c
    free = jnp.sum(~st.active)
    return (step < max_steps) & jnp.any(st.active) & (free < exit_free)

  def body(c):
    ca, st, step = c
    ca, st = decode_step(cfg, params, ca, st)
    return ca, st, step + 1

  return jax.lax.while_loop(cond, body, (cache, state, jnp.int32(0)))
