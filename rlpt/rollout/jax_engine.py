"""JaxEngine: the embedded rollout engine (jitted prefill + while-loop decode).

    model, tokenizer = rlpt.models.load_model("smollm2-135m-instruct")
    engine = JaxEngine(model, tokenizer, JaxEngineConfig(max_batch=64))
    completions = engine.generate([GenerateRequest(messages=(...,), n=8)])
    engine.update_weights("/ckpt/params", version=3)   # or a params pytree

Scheduling (continuous batching): the engine owns `B` decode slots, each one row
of a preallocated KV cache of S slots. A request's n samples are one work item:
its prompt is prefilled once and its KV rows copied into n decode slots
(`decode.prefill`, then `decode.install`). The decode loop (`decode.decode`, a `lax.while_loop`) runs
until every slot is done, or until enough slots are free for the next waiting
item, which the host then prefills into them while the other slots keep their
state; so a long tail never holds a batch of finished slots idle while work
waits. Stop strings are text, so rows that have them are checked on the host
every `stop_check_interval` steps. `stats` reports slot utilisation (generated
tokens / (decode steps x slots)) and the number of compiled programs.

Shapes are bucketed so compiles stay bounded: the prompts admitted together are
packed several to a prefill row (they do not attend to each other; a row's common
prefix, such as a chat template, is held and computed once: `prefill_packing`), rows
of the power-of-two bucket of the longest prompt (>= min_prompt_bucket; from
`ModelConfig.blockwise_from` tokens on, a multiple of `length_multiple`) or a wider
power of two up to `prefill_row_tokens` where that computes fewer columns, the row
count to a power of two up to 8 and then a multiple of 8; the cache length and the
output buffer to multiples of `length_multiple`; the slot count to a power of two.

Long prompts: a prefill row of `blockwise_from` (4096) columns or more attends in tiles
(no [P, P] scores). Weights in a context-parallel learner's layout (a mesh with a
`seq` axis > 1 that splits them over nothing else) are gathered to one device for
decoding, and such long prefills run as ring attention over that mesh
(`decode.prefill` under `jax.set_mesh`), their keys/values then moved into the
one-device cache (`decode.install`).

Multi-turn episodes (`generate(continue_fn=...)`, rlpt.envs.episode): when a
sample ends a turn, its environment answers on a worker thread while the other
slots decode (the loop returns to the host as soon as a slot ends a turn); the
answer's tokens are appended to the slot's own KV cache (`decode.extend`, one
cached forward over just those tokens, answers that arrive together in one call)
and the slot samples its next turn. The history is never prefilled again.

Memory: the KV cache (2 x L x B x S x K x Dh x 4 bytes) must fit
`kv_cache_mib`; the engine shrinks B to fit, and a request whose own sample does
not fit gets a ValueError naming it, before anything is allocated.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import os
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlpt.models import decoder, projections
from rlpt.rollout import decode, prefill_packing, requests as req_lib
from rlpt.rollout.engine import (Completion, GenerateRequest, RolloutEngine, SamplingParams,
                                 WeightUpdateStats)


@dataclasses.dataclass(frozen=True)
class JaxEngineConfig:
  """JaxEngine settings.

  Attributes:
    max_batch: decode slots (samples decoded together).
    max_len: longest prompt + max_new_tokens a sample may have.
    kv_cache_mib: budget for the KV cache in MiB.
    min_prompt_bucket: smallest prompt-length bucket (buckets are powers of two).
    prefill_row_tokens: widest prefill row (columns) the prompts admitted together may
      be packed into, where wider rows cost less (`prefill_packing`); rows are never
      narrower than the longest prompt's bucket.
    share_prefixes: a row's prompts hold their common prefix (a chat template, a
      domain's instructions) once, computed once (`prefill_packing`).
    length_multiple: cache length and output buffer are rounded up to this.
    refill: continuous batching; False = static batches (a new batch starts only
      when every slot of the previous one finished).
    refill_fraction: with refill, the decode loop hands back to the host once this
      fraction of the slots (or the next item's n, if larger) is free.
    stop_check_interval: decode steps between host checks of stop strings.
    answer_check_interval: multi-turn episodes (`generate(continue_fn=...)`): decode
      steps between host checks for environment answers while a slot waits for one
      (its slot idles until the next check; a check costs one small device-to-host
      read, far less than a decode step).
    seed: seed of requests that set none.
  """

  max_batch: int = 64
  max_len: int = 4096
  kv_cache_mib: float = 4096.0
  min_prompt_bucket: int = 32
  prefill_row_tokens: int = 512
  share_prefixes: bool = True
  length_multiple: int = 64
  refill: bool = True
  refill_fraction: float = 0.125
  stop_check_interval: int = 16
  answer_check_interval: int = 2
  seed: int = 0

  def __post_init__(self):
    for f in ("max_batch", "max_len", "min_prompt_bucket", "prefill_row_tokens",
              "length_multiple", "stop_check_interval", "answer_check_interval"):
      if getattr(self, f) < 1:
        raise ValueError(f"JaxEngineConfig.{f} must be >= 1, got {getattr(self, f)}")
    if not self.kv_cache_mib > 0:
      raise ValueError(f"JaxEngineConfig.kv_cache_mib must be > 0, got {self.kv_cache_mib}")
    if not 0 < self.refill_fraction <= 1:
      raise ValueError(f"JaxEngineConfig.refill_fraction must be in (0, 1], got "
                       f"{self.refill_fraction}")


def token_versions(spans: Sequence[tuple[int, int]], length: int) -> list[int]:
  """Per-token weight versions of a sample of `length` tokens from its spans
  [(first token index, version), ...] (ascending; the first starts at 0)."""
  out = []
  for (start, v), nxt in zip(spans, list(spans[1:]) + [(length, None)]):
    out += [v] * max(0, min(nxt[0], length) - len(out))
  return out[:length]


_WALL = -1  # host-side finish code: the sample passed its max_wall_s


def _pow2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


# How long a blocked engine waits for more environment answers after the first.
_GATHER_S = 0.005


def turn_seed(seed: int, turn: int) -> int:
  """The sampling seed of turn `turn` of an episode whose first turn drew with
  `seed` (turn 0): each turn draws fresh random numbers (the keys also fold in the
  sample index and the token's position within the turn)."""
  return (int(seed) + 0x9E3779B1 * int(turn)) & 0xFFFFFFFF


def _round_up(n: int, m: int) -> int:
  return -(-int(n) // m) * m


@dataclasses.dataclass
class _Item:
  """One request's samples (or a chunk of them) that share one prefill."""

  request: int
  prompt: list[int]
  samples: list[int]
  sampling: SamplingParams
  stop_ids: tuple[int, ...]
  seed: int


@dataclasses.dataclass
class GenerateStats:
  """What the last `generate` call did (cumulative fields are per call)."""

  seconds: float = 0.0
  prefill_seconds: float = 0.0
  decode_seconds: float = 0.0
  generated_tokens: int = 0
  prompt_tokens: int = 0
  prefill_columns: int = 0  # columns the prefills computed (rows x width, padding included)
  shared_admissions: int = 0  # admissions laid out with shared prefixes (prefill_packing)
  decode_steps: int = 0
  slots: int = 0
  cache_len: int = 0
  admissions: int = 0
  weight_swaps: int = 0    # versions adopted mid-call (generate(adopt_weights=True))
  extensions: int = 0      # turns continued from the KV cache (generate(continue_fn=...))
  extend_tokens: int = 0   # environment tokens those extensions added
  extend_seconds: float = 0.0
  wall_capped: int = 0     # samples ended by SamplingParams.max_wall_s (finish_reason "time")

  @property
  def slot_utilisation(self) -> float:
    """Generated tokens / (decode steps x slots): 1.0 means no slot ever idled."""
    total = self.decode_steps * self.slots
    return self.generated_tokens / total if total else 0.0


def _split_over(x: jax.Array) -> set[str]:
  """The mesh axes an array's NamedSharding splits it over."""
  spec = getattr(x.sharding, "spec", ())
  return {a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)}


def _ring_mesh(params: Any) -> jax.sharding.Mesh | None:
  """The mesh of `params` when it has a "seq" axis > 1 and splits no weight over any
  other axis (a context-parallel learner's layout: each ring holds one copy of the
  model, split over "seq"), on this process's devices; else None."""
  leaves = jax.tree.leaves(params)
  meshes = {getattr(x.sharding, "mesh", None) for x in leaves}
  if len(meshes) != 1:
    return None
  mesh = meshes.pop()
  if (not isinstance(mesh, jax.sharding.Mesh) or mesh.shape.get("seq", 1) < 2
      or any(d.process_index != jax.process_index() for d in mesh.devices.flat)
      or any(_split_over(x) - {"seq"} for x in leaves)):
    return None
  return mesh


def _one_device_if_whole_per_group(params: Any, on_ring: bool) -> Any:
  """`params` gathered on the first of their devices when they are whole on each of
  several devices, or split over "seq" alone (a learner mesh whose axes split no weight
  but the ring's, e.g. `seq` alone or `data` alone): the engine would otherwise run
  every prefill and decode step, and hold the KV cache, once per device, the same work
  repeated (on the 8-device `seq` mesh of a long-context run, 8 copies of a 4 GiB
  cache). Long prefills still run over the ring (`JaxEngine._admit`). Weights split
  over data, fsdp or tensor stay as they are. `on_ring`: `_ring_mesh(params)` found one."""
  leaves = jax.tree.leaves(params)
  devices = {d for x in leaves for d in x.sharding.device_set}
  if (len(devices) < 2 or any(d.process_index != jax.process_index() for d in devices)
      or not (on_ring or all(x.sharding.is_fully_replicated for x in leaves))):
    return params
  first = jax.sharding.SingleDeviceSharding(min(devices, key=lambda d: d.id))
  return jax.tree.map(lambda x: jax.device_put(x, first), params)


def _to_param_dict(source: Any) -> Any:
  """A Decoder, nnx.State or nested dict of arrays -> nested dict of arrays."""
  if isinstance(source, decoder.Decoder):
    return source.arrays()
  to_pure = getattr(source, "to_pure_dict", None)
  if callable(to_pure):
    return to_pure()
  return source


class JaxEngine(RolloutEngine):
  """Embedded rollout engine over an `rlpt.models.Decoder` (see module docstring)."""

  #: generate(continue_fn=...) continues multi-turn episodes from their KV cache
  continues_turns = True

  def __init__(self, model: decoder.Decoder, tokenizer: Any,
               config: JaxEngineConfig | None = None, *, version: int = 0):
    self.model_config: decoder.ModelConfig = model.config
    self.config = config or JaxEngineConfig()
    self.tokenizer = tokenizer
    # Committed to their devices, as restored or device_put weights are: jit keys
    # on that, so swapping weights later never recompiles.
    arrays = model.arrays()
    # A learner mesh with a "seq" ring: decode on one device, prefill long prompts
    # (>= model_config.blockwise_from tokens) as ring attention over the mesh.
    self._ring = _ring_mesh(arrays)
    self._ring_shardings = (None if self._ring is None
                            else jax.tree.map(lambda x: x.sharding, arrays))
    self._ring_params = (None, None)  # (the one-device params, their copy on the ring)
    self.ring_prefills = 0            # admissions prefilled over the ring so far
    self._attn_scale = prefill_packing.attention_scale(self.model_config)
    self._params = jax.tree.map(lambda x: jax.device_put(x, x.sharding),
                                _one_device_if_whole_per_group(arrays, self._ring is not None))
    # The CPU decode-attention kernel has no partitioning rule: sharded weights (and so a
    # sharded cache) take the XLA path instead of gathering the cache to every device.
    self._sharded = len({d for x in jax.tree.leaves(self._params)
                         for d in x.sharding.device_set}) > 1
    if self._sharded:
      self.model_config = self.model_config.replace(decode_kernel=False)
    # The dtype the decode loop reads its projection weights in (None: as stored). With a
    # bfloat16 compute dtype, bfloat16: half the bytes a step streams, the same numbers
    # (`proj` casts every weight to the compute dtype before its dot). Norms and the
    # embedding (whose lookup feeds the float32 residual stream) stay float32, as in
    # the learner.
    dt = self.model_config.compute_dtype
    self._weight_dtype = None if dt == jnp.float32 else dt
    self._decode_params = self._decode_layout(self._params)
    self._version = int(version)
    # (params, decode params, version), swapped as one reference: a generate running on
    # another thread with adopt_weights reads it between decode chunks.
    self._weights = (self._params, self._decode_params, self._version)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
      eos = self.model_config.eos_token_id
    self._eos_ids = tuple(e for e in (eos if isinstance(eos, (list, tuple)) else [eos])
                          if e is not None)
    self.last_stats = GenerateStats()

  @classmethod
  def from_pretrained(cls, path: str, config: JaxEngineConfig | None = None, *,
                      dtype: str = "float32", mesh=None, version: int = 0) -> "JaxEngine":
    """Loads a model with `rlpt.models.load_model` and wraps it."""
    from rlpt.models import load_model
    model, tokenizer = load_model(path, dtype=dtype, mesh=mesh)
    return cls(model, tokenizer, config, version=version)

  @property
  def weight_version(self) -> int:
    return self._version

  @property
  def params(self) -> Any:
    """The current weights (nested dict of arrays, `Decoder.arrays()` layout)."""
    return self._params

  @property
  def decode_params(self) -> Any:
    """The weights the decode loop reads: `params` re-laid out per layer on one CPU
    device (`projections.unstack_layers`), else `params` itself."""
    return self._decode_params

  def compiled_programs(self) -> dict[str, int]:
    """How many programs each jitted function has compiled in this process."""
    return {"prefill": decode.prefill._cache_size(), "install": decode.install._cache_size(),
            "decode": decode.decode._cache_size(), "extend": decode.extend._cache_size()}

  # ---------------------------------------------------------------- weights

  def update_weights(self, source: Any, version: int) -> WeightUpdateStats:
    """Swaps the weights; shapes, dtypes and shardings stay, so nothing recompiles.

    Args:
      source: a params pytree (`Decoder`, `nnx.State`, or the nested dict of
        `Decoder.arrays()`), or the path of an Orbax checkpoint of that dict
        (`orbax.checkpoint.StandardCheckpointer().save(path, params)`), which is
        restored straight into the current weights' shardings.
      version: tagged on every later completion.
    Returns:
      WeightUpdateStats(version, wall seconds until the new weights are ready, bytes).
    """
    t0 = time.perf_counter()
    target = self._params
    if isinstance(source, (str, os.PathLike)):
      new = self._restore(os.fspath(source), target)
    else:
      new = _to_param_dict(source)
      self._check_tree(new, target, "update_weights(params)")
      new = jax.tree.map(lambda x, t: jax.device_put(jnp.asarray(x, t.dtype), t.sharding),
                         new, target)
    new, decode_params = jax.block_until_ready((new, self._decode_layout(new)))
    self._params, self._decode_params = new, decode_params
    self._version = int(version)
    self._weights = (new, decode_params, int(version))
    nbytes = sum(x.nbytes for x in jax.tree.leaves(new))
    return WeightUpdateStats(version=int(version), seconds=time.perf_counter() - t0,
                             bytes=int(nbytes))

  def _decode_layout(self, params: Any) -> Any:
    """The weights the decode loop reads (projections in the compute dtype). On one CPU
    device: per-layer arrays
    (`projections.unstack_layers`; XLA:CPU would otherwise copy every layer's weights out
    of the [L, ...] stacks on every step: b16 SmolLM2 decode step 79 -> 65 ms), a
    second copy of the layer weights, made by one compiled program per layer
    (`projections.unstack_layers_jit`: ≈0.05 s a SmolLM2 update, ≈0.4 s eagerly).
    Otherwise the stacked weights themselves."""
    if self._sharded or jax.default_backend() != "cpu":
      return projections.cast_projections(params, self._weight_dtype)
    return projections.unstack_layers_jit(params, self._weight_dtype)

  @staticmethod
  def _check_tree(new: Any, target: Any, what: str) -> None:
    flat_t = dict(jax.tree_util.tree_flatten_with_path(target)[0])
    flat_n = dict(jax.tree_util.tree_flatten_with_path(new)[0])
    name = jax.tree_util.keystr
    missing = sorted(name(k) for k in flat_t.keys() - flat_n.keys())
    extra = sorted(name(k) for k in flat_n.keys() - flat_t.keys())
    if missing or extra:
      raise ValueError(f"{what}: parameter tree differs from the engine's: missing {missing}, "
                       f"unexpected {extra}")
    for k, t in flat_t.items():
      if tuple(np.shape(flat_n[k])) != tuple(t.shape):
        raise ValueError(f"{what}: tensor {name(k)} has shape {tuple(np.shape(flat_n[k]))}, "
                         f"expected {tuple(t.shape)}")

  def _restore(self, path: str, target: Any) -> Any:
    import orbax.checkpoint as ocp
    if not os.path.isdir(path):
      raise FileNotFoundError(f"update_weights: Orbax checkpoint directory {path!r} does not exist")
    ckpt = ocp.StandardCheckpointer()
    try:
      meta = ckpt.metadata(path).item_metadata.tree
    except Exception as e:  # noqa: BLE001 -- re-raised with the path
      raise ValueError(f"update_weights: {path!r} is not an Orbax StandardCheckpointer "
                       f"checkpoint ({type(e).__name__}: {e})") from e
    self._check_tree(jax.tree.map(lambda m: np.empty(m.shape, np.uint8) if hasattr(m, "shape")
                                  else m, meta), target, f"update_weights({path!r})")
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            target)
    return ckpt.restore(path, abstract)

  # ---------------------------------------------------------------- generate

  def _plan(self, reqs: Sequence[GenerateRequest], context_len: int | None = None):
    cfg, mc = self.config, self.model_config
    items, prompts = [], []
    for i, r in enumerate(reqs):
      if not isinstance(r, GenerateRequest):
        raise TypeError(f"request {i}: expected a GenerateRequest, got {type(r).__name__}")
      sp = r.sampling
      req_lib.check_sampling(sp, i, mc.vocab_size)
      ids = req_lib.prompt_ids(r, self.tokenizer, i)
      if len(ids) + sp.max_new_tokens > cfg.max_len:
        raise ValueError(f"request {i}: prompt ({len(ids)} tokens) + max_new_tokens "
                         f"({sp.max_new_tokens}) exceeds JaxEngineConfig.max_len={cfg.max_len}")
      if len(ids) + sp.max_new_tokens > mc.max_position_embeddings:
        raise ValueError(
            f"request {i}: prompt ({len(ids)} tokens) + max_new_tokens ({sp.max_new_tokens}) "
            f"exceeds the model's context, ModelConfig.max_position_embeddings="
            f"{mc.max_position_embeddings}: prompts of up to "
            f"{mc.max_position_embeddings - sp.max_new_tokens} tokens fit (a longer context "
            f"needs a model, or RoPE scaling, made for it)")
      bad = [t for t in ids if not 0 <= t < mc.vocab_size]
      if bad:
        raise ValueError(f"request {i}: prompt token ids {bad[:5]} outside [0, {mc.vocab_size})")
      prompts.append(ids)
      seed = cfg.seed if sp.seed is None else sp.seed
      items.append(_Item(i, ids, list(range(r.n)), sp, req_lib.stop_token_set(sp, self._eos_ids),
                         int(seed) & 0xFFFFFFFF))
    # Every decode step reads all S slots of every row, so S is the longest prompt +
    # its max_new_tokens (rounded), not its power-of-two prefill bucket.
    need = [len(p) + r.sampling.max_new_tokens for p, r in zip(prompts, reqs)]
    if context_len is not None:  # continued samples (episodes) grow to this many tokens
      if context_len > cfg.max_len:
        raise ValueError(f"context_len={context_len} exceeds JaxEngineConfig.max_len="
                         f"{cfg.max_len}")
      need = [max(n, context_len) for n in need]
    max_new = max(r.sampling.max_new_tokens for r in reqs)
    S = _round_up(max(need), cfg.length_multiple)
    M = _round_up(max_new, cfg.length_multiple)
    per_slot = 2 * mc.num_layers * S * mc.num_kv_heads * mc.head_dim * 4
    budget = int(cfg.kv_cache_mib * 2 ** 20)
    if per_slot > budget:
      worst = max(range(len(reqs)), key=lambda i: need[i])
      raise ValueError(
          f"request {worst}: one sample needs a KV cache row of {S} slots = "
          f"{per_slot / 2**20:.1f} MiB, over JaxEngineConfig.kv_cache_mib={cfg.kv_cache_mib}")
    total = sum(r.n for r in reqs)
    slots = min(_pow2(min(cfg.max_batch, total)), cfg.max_batch)
    while slots > 1 and slots * per_slot > budget:
      slots //= 2
    chunked = []
    for it in items:  # a request with n > slots is prefilled once per chunk of slots
      for c in range(0, len(it.samples), slots):
        chunked.append(dataclasses.replace(it, samples=it.samples[c:c + slots]))
    num_stop = max(4, _pow2(max(len(it.stop_ids) for it in items)))
    return chunked, S, M, slots, num_stop

  def _p_bucket(self, n: int) -> int:
    """Prefill columns for an n-token prompt: its power-of-two bucket; from
    `blockwise_from` tokens on, n rounded up to `length_multiple` (a 17k-token prompt
    would otherwise be prefilled over 32k columns, 4x the attention work)."""
    bw = self.model_config.blockwise_from
    if bw and n >= bw:
      m = self.config.length_multiple
      if self._ring is not None:  # and a multiple of the ring's 2 x seq zigzag chunks
        m = math.lcm(m, 2 * self._ring.shape["seq"])
      return max(bw, _round_up(n, m))
    return max(self.config.min_prompt_bucket, _pow2(n))

  def generate(self, requests: Sequence[GenerateRequest], *,
               deadline_s: float | None = None, adopt_weights: bool = False,
               on_tokens: Callable[[int, int, list[int]], None] | None = None,
               continue_fn: Callable[[int, int, Completion], tuple[list[int], int] | None]
               | None = None, context_len: int | None = None) -> list[Completion]:
    """Samples every request (see RolloutEngine.generate).

    `deadline_s` (optional): wall seconds after which unfinished samples are
    returned with finish_reason "abort" (with the tokens they have so far).
    A request's `sampling.max_wall_s` caps each of its samples apart, from the
    sample's admission into a slot: past it the sample ends with finish_reason
    "time" and the tokens it has (checked every `stop_check_interval` steps), and
    its slot takes the next waiting work.
    `adopt_weights`: weights swapped in by `update_weights` on another thread while
    this call runs are taken up between decode chunks (every `stop_check_interval`
    steps): unfinished samples go on under the new version (partial rollouts), their
    KV cache as it was; each completion's `token_versions` then says which version
    sampled each token, and `weight_version` is its first token's.
    `on_tokens(request index, sample index, token ids so far)`: called (on this
    thread) between decode chunks of `stop_check_interval` steps for every sample
    still running that grew since its last call (streaming); a sample's finished
    tokens come only in its Completion.
    `continue_fn(request index, sample index, completion of the turn)` (multi-turn
    episodes): called on a worker thread when a sample finishes a turn; it returns
    None (the sample is done) or (ids, max_new_tokens): the environment's tokens,
    which `decode.extend` appends to the slot's KV cache (no re-prefill of the
    history) before the slot samples its next turn of at most max_new_tokens.
    Other slots decode while it runs. Each turn's Completion has that turn's tokens
    (the opening prompt as prompt_ids); the call returns each sample's last turn.
    The slot's cache holds `context_len` tokens (prompt, turns and environment
    tokens together), so the returned max_new_tokens must keep within it. Samples
    must end on stop tokens (no stop strings), and neither deadline_s, max_wall_s,
    adopt_weights nor on_tokens combine with it (an episode has its own caps:
    rlpt.envs.episode).
    """
    t0 = time.perf_counter()
    requests = list(requests)
    if not requests:
      return []
    if continue_fn is not None:
      if deadline_s is not None or adopt_weights or on_tokens is not None:
        raise ValueError("generate: continue_fn does not combine with deadline_s, "
                         "adopt_weights or on_tokens")
      if any(r.sampling.stop for r in requests):
        raise ValueError("generate: continue_fn needs samples that end on stop tokens; a "
                         "stop string would leave tokens in the cache that the turn dropped")
      if any(r.sampling.max_wall_s is not None for r in requests):
        raise ValueError("generate: continue_fn does not combine with sampling.max_wall_s "
                         "(an episode is capped by its turns, context and tool time)")
    items, S, M, B, NS = self._plan(requests, context_len)
    mc, cfg = self.model_config, self.config
    stats = GenerateStats(slots=B, cache_len=S)
    params, decode_params, version = self._weights
    starts: list[list[tuple[int, int]]] = [[] for _ in range(B)]  # per slot: (token, version)
    cache = decoder.init_cache(mc, B, S, jnp.float32)
    state = decode.empty_state(B, M, NS)
    pending = collections.deque(items)
    owner: list[tuple[_Item, int] | None] = [None] * B
    results: dict[tuple[int, int], Completion] = {}
    req_ids = [r.request_id if r.request_id is not None else f"req-{i}"
               for i, r in enumerate(requests)]
    big = np.iinfo(np.int32).max
    reported = [0] * B     # on_tokens: tokens a slot's sample has reported
    waiting: dict[int, concurrent.futures.Future] = {}  # slot -> its continue_fn call
    turns = [0] * B        # continue_fn: turns a slot's sample has finished
    held = [0] * B         # continue_fn: tokens a slot's sample holds (prompt, turns, env)
    admitted = [0.0] * B   # perf_counter when a slot's sample was admitted (max_wall_s)
    workers = (concurrent.futures.ThreadPoolExecutor(B, thread_name_prefix="rlpt-episode")
               if continue_fn is not None else None)

    def complete(it: _Item, s: int, toks, logp, logq, code: int, b: int | None = None):
      stops = it.sampling.stop
      fin = req_lib.finish_sample(self.tokenizer, [int(t) for t in toks],
                                  [float(x) for x in logp], [float(x) for x in logq],
                                  code == decode.STOP, stops)
      reason = ("stop" if fin.stopped else "abort" if code == decode.ABORT
                else "time" if code == _WALL else "length")
      stats.wall_capped += reason == "time"
      spans = starts[b] if b is not None else [(0, version)]
      per_token = token_versions(spans, len(fin.token_ids))
      results[(it.request, s)] = Completion(
          request_id=req_ids[it.request], sample_index=s, prompt_ids=list(it.prompt),
          token_ids=fin.token_ids, text=fin.text, logprobs=fin.logprobs,
          sampling_logprobs=fin.sampling_logprobs, finish_reason=reason,
          weight_version=spans[0][1],
          token_versions=per_token if len({v for _, v in spans}) > 1 else None)

    while True:
      if waiting:
        # Block for an environment only when no slot decodes and no work can enter.
        decoding = any(o is not None and b not in waiting for b, o in enumerate(owner))
        room = pending and len(pending[0].samples) <= sum(o is None for o in owner)
        cache, state = self._continue(decode_params, cache, state, waiting, owner, turns, starts,
                                      held, S, version, stats, block=not decoding and not room)
      free = [b for b in range(B) if owner[b] is None]
      batch_items = []
      if pending and (cfg.refill or len(free) == B):
        while pending and len(pending[0].samples) <= len(free) - sum(
            len(x.samples) for x in batch_items):
          batch_items.append(pending.popleft())
      if batch_items:
        tp = time.perf_counter()
        cache, state = self._admit(params, cache, state, batch_items, free, owner, B, NS,
                                   stats)
        for b in free:
          if owner[b] is not None:
            starts[b] = [(0, version)]
            reported[b] = 0
            held[b] = len(owner[b][0].prompt)
        jax.block_until_ready(state.active)
        now = time.perf_counter()
        for b in free:
          if owner[b] is not None:
            admitted[b] = now
        stats.prefill_seconds += now - tp
        stats.admissions += 1
        stats.prompt_tokens += sum(len(it.prompt) for it in batch_items)
      if all(o is None for o in owner):
        break
      if all(o is None or b in waiting for b, o in enumerate(owner)):
        continue  # nothing decodes: wait for an environment (top of the loop)
      if pending:
        need = len(pending[0].samples)
        exit_free = need if not cfg.refill else max(
            need, min(math.ceil(cfg.refill_fraction * B), sum(len(x.samples) for x in pending)))
        exit_free = B if not cfg.refill else exit_free
      else:
        exit_free = B + 1
      exit_free += len(waiting)  # slots waiting for their environment are inactive, not free
      if workers is not None:  # episodes: back as soon as a slot ends its turn, to continue it
        exit_free = min(exit_free, sum(o is None or b in waiting for b, o in enumerate(owner)) + 1)
      has_stops = any(o is not None and o[0].sampling.stop for o in owner)
      has_caps = any(o is not None and o[0].sampling.max_wall_s is not None for o in owner)
      max_steps = (cfg.stop_check_interval if (has_stops or has_caps or deadline_s is not None
                                               or adopt_weights or on_tokens)
                   else big)
      if waiting:  # a slot idles until its environment's answer is taken up
        max_steps = min(max_steps, cfg.answer_check_interval)
      td = time.perf_counter()
      cache, state, steps = decode.decode(mc, decode_params, cache, state, jnp.int32(max_steps),
                                          jnp.int32(exit_free))
      active, n_gen, finish = jax.device_get((state.active, state.n_gen, state.finish))
      stats.decode_seconds += time.perf_counter() - td
      stats.decode_steps += int(steps)
      now = time.perf_counter()
      timed_out = deadline_s is not None and now - t0 > deadline_s
      done_rows, out = [], None
      for b in range(B):
        if owner[b] is None or b in waiting:
          continue
        code = int(finish[b])
        if active[b]:
          cap = owner[b][0].sampling.max_wall_s
          if timed_out:
            code = decode.ABORT
          elif cap is not None and now - admitted[b] > cap:
            code = _WALL
          elif owner[b][0].sampling.stop:
            if out is None:
              out = jax.device_get((state.out_tokens, state.out_logp, state.out_logq))
            text = self.tokenizer.decode([int(t) for t in out[0][b, :n_gen[b]]])
            if req_lib.find_stop_string(text, owner[b][0].sampling.stop) < 0:
              continue
            code = decode.RUNNING  # a stop string: finish_sample cuts the text there
          else:
            continue
        done_rows.append((b, code))
      if done_rows:
        if out is None:
          out = jax.device_get((state.out_tokens, state.out_logp, state.out_logq))
        for b, code in done_rows:
          it, s = owner[b]
          n = int(n_gen[b])
          stats.generated_tokens += n
          complete(it, s, out[0][b, :n], out[1][b, :n], out[2][b, :n], code, b)
          if workers is not None:  # the environment answers; the slot keeps its cache
            held[b] += n
            waiting[b] = workers.submit(continue_fn, it.request, s, results[(it.request, s)])
          else:
            owner[b] = None
        still = [b for b, _ in done_rows if active[b]]
        if still:
          state = state._replace(active=state.active.at[jnp.asarray(still)].set(False))
      if on_tokens is not None:
        grew = [b for b in range(B) if owner[b] is not None and n_gen[b] > reported[b]]
        if grew and out is None:
          out = jax.device_get((state.out_tokens, state.out_logp, state.out_logq))
        for b in grew:
          reported[b] = int(n_gen[b])
          on_tokens(owner[b][0].request, owner[b][1], [int(t) for t in out[0][b, :n_gen[b]]])
      if adopt_weights and self._weights[2] != version:  # a partial-rollout weight swap
        params, decode_params, version = self._weights
        stats.weight_swaps += 1
        for b in range(B):
          if owner[b] is not None:  # its next token is the new version's
            starts[b].append((int(n_gen[b]), version))
      if timed_out:
        for it in pending:
          for s in it.samples:
            complete(it, s, [], [], [], decode.ABORT)
        pending.clear()
    if workers is not None:
      workers.shutdown()
    stats.seconds = time.perf_counter() - t0
    self.last_stats = stats
    return [results[(i, s)] for i, r in enumerate(requests) for s in range(r.n)]

  def _continue(self, decode_params, cache, state, waiting: dict, owner: list, turns: list,
                starts: list, held: list, S: int, version: int, stats: "GenerateStats", *,
                block: bool):
    """Takes the answers of finished continue_fn calls: frees the slots whose sample
    is done, extends the others with their environment tokens (one `decode.extend`
    for all of them). With `block`, first waits for at least one answer."""
    if block:
      concurrent.futures.wait(list(waiting.values()),
                              return_when=concurrent.futures.FIRST_COMPLETED)
      # answers that come right behind the first join its extension (one call, and the
      # slots go on decoding in step)
      concurrent.futures.wait(list(waiting.values()), timeout=_GATHER_S)
    conts = []
    for b in [b for b, f in waiting.items() if f.done()]:
      got = waiting.pop(b).result()  # (an environment that raised fails the call)
      if got is None:
        owner[b] = None
        continue
      ids, max_new = got
      ids, max_new = [int(t) for t in ids], int(max_new)
      if not ids or max_new < 1:
        raise ValueError(f"continue_fn for slot {b}: needs >= 1 token and max_new_tokens "
                         f">= 1, got {len(ids)} tokens and {max_new}")
      if held[b] + len(ids) + max_new > S:
        raise ValueError(f"continue_fn for slot {b}: {held[b]} tokens held + {len(ids)} new + "
                         f"max_new_tokens {max_new} exceed the slot's {S} (context_len)")
      held[b] += len(ids)
      turns[b] += 1
      conts.append((b, ids, max_new))
    if not conts:
      return cache, state
    B = len(owner)
    A = min(_pow2(len(conts)), B)
    # multiples of min_prompt_bucket, not powers of two: an environment turn is often
    # just past a power of two, and these tokens are computed in full
    T = _round_up(max(len(ids) for _, ids, _ in conts), self.config.min_prompt_bucket)
    rows = np.full((A,), B, np.int32)
    tokens = np.zeros((A, T), np.int32)
    n = np.ones((A,), np.int32)
    nxt, mx = np.zeros((A,), np.int32), np.ones((A,), np.int32)
    seeds = np.zeros((A,), np.uint32)
    for a, (b, ids, max_new) in enumerate(conts):
      it, _ = owner[b]
      rows[a], n[a], nxt[a], mx[a] = b, len(ids), ids[-1], max_new
      tokens[a, 1:len(ids)] = ids[:-1]  # column 0: the slot's last sampled token (device)
      seeds[a] = turn_seed(it.seed, turns[b])
      starts[b] = [(0, version)]
    tp = time.perf_counter()
    cache, state = decode.extend(self.model_config, decode_params, cache, state,
                                 jnp.asarray(rows),
                                 jnp.asarray(tokens), jnp.asarray(n), jnp.asarray(nxt),
                                 jnp.asarray(mx), jnp.asarray(seeds))
    jax.block_until_ready(state.active)
    stats.extend_seconds += time.perf_counter() - tp
    stats.extensions += len(conts)
    stats.extend_tokens += sum(len(ids) for _, ids, _ in conts)
    return cache, state

  def _admit(self, params, cache, state, items: list[_Item], free: list[int], owner, B: int,
             NS: int, stats: GenerateStats):
    """Prefills `items` once each and assigns their samples to free slots.

    The prompts (all tokens but their last, which the decode loop feeds) are laid out
    in rows by `prefill_packing.pack`: several to a row, not attending to each other,
    a row's common prefix held once; rows of P columns, P the power-of-two bucket of
    the longest or a wider power of two up to `prefill_row_tokens` where that costs
    less. So the prefill computes about the prompts' own tokens, not each one padded
    to its bucket, and a shared chat template once a row.
    """
    P = max(self._p_bucket(len(it.prompt)) for it in items)
    bw = self.model_config.blockwise_from
    widths = [P]
    if not (bw and P >= bw):  # long prompts keep their own bucket (tiles / ring)
      top = min(self.config.prefill_row_tokens, bw - 1) if bw else self.config.prefill_row_tokens
      while widths[-1] * 2 <= top:  # wider rows stay short of the blockwise path
        widths.append(widths[-1] * 2)
    lay = prefill_packing.pack([it.prompt[:-1] for it in items], widths,
                               attn_scale=self._attn_scale,
                               share=self.config.share_prefixes)
    tokens, segments, positions = lay.tokens, lay.segments, lay.positions
    P = tokens.shape[1]
    stats.prefill_columns += lay.columns
    stats.shared_admissions += int(lay.shared)
    A = B
    rows = np.full((A,), B, np.int32)
    cols = {k: np.zeros((A,), dt) for k, dt in (
        ("src_row", np.int32), ("src_off", np.int32), ("prefix", np.int32),
        ("length", np.int32), ("last", np.int32),
        ("max_new", np.int32), ("temperature", np.float32), ("top_p", np.float32),
        ("top_k", np.int32), ("seed", np.uint32), ("sample_index", np.int32))}
    cols["length"][:] = 1
    stop_ids = np.full((A, NS), -1, np.int32)
    a = 0
    for j, it in enumerate(items):
      sp = it.sampling
      for s in it.samples:
        b = free[a]
        owner[b] = (it, s)
        rows[a] = b
        cols["src_row"][a], cols["src_off"][a], cols["prefix"][a] = lay.place[j]
        cols["length"][a] = len(it.prompt)
        cols["last"][a] = it.prompt[-1]
        cols["max_new"][a] = sp.max_new_tokens
        cols["temperature"][a] = sp.temperature
        cols["top_p"][a] = sp.top_p
        cols["top_k"][a] = sp.top_k
        cols["seed"][a] = it.seed
        cols["sample_index"][a] = s
        stop_ids[a, :len(it.stop_ids)] = it.stop_ids
        a += 1
    adm = decode.Admission(rows=rows, stop_ids=stop_ids, **cols)
    if self._ring is not None and P >= max(self.model_config.blockwise_from, 1):
      return self._ring_admit(params, cache, state, tokens, segments, positions, adm)
    # Two programs, not one: the prefill (a whole forward, the longer compile) then
    # depends on the rows' shape alone, and only the install (a gather and scatter)
    # on the slots and cache length too, which vary with each batch's size and
    # longest prompt.
    new_k, new_v = decode.prefill(self.model_config, params, jnp.asarray(tokens),
                                  jnp.asarray(segments), jnp.asarray(positions))
    return decode.install(cache, state, new_k, new_v, jax.tree.map(jnp.asarray, adm))

  def _ring_admit(self, params, cache, state, tokens, segments, positions, adm):
    """The prefill as ring attention over the learner's mesh
    (`self._ring`; every member holds 1/seq of each prompt's activations, no [P, P]
    scores), its keys/values then gathered into the one-device cache."""
    mesh = self._ring  # _p_bucket made P a multiple of the ring's 2 x seq chunks
    held, ring_params = self._ring_params
    if held is not params:  # new weights: one copy on the ring, reused until the next
      ring_params = jax.device_put(params, self._ring_shardings)
      self._ring_params = (params, ring_params)
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "seq"))
    with jax.set_mesh(mesh):
      new_k, new_v = decode.prefill(self.model_config.replace(decode_kernel=False), ring_params,
                                    *(jax.device_put(a, rows) for a in (tokens, segments,
                                                                        positions)))
    here = jax.tree.leaves(cache)[0].sharding
    new_k, new_v = jax.device_put((new_k, new_v), here)
    self.ring_prefills += 1
    return decode.install(cache, state, new_k, new_v,
                          jax.device_put(jax.tree.map(np.asarray, adm), here))
