"""Supervised warm-up on demonstrations: teach the answer format before RL.

    result = run_sft(model, tokenizer, sources, config, directory)   # model updated in place

A demonstration is a training task's prompt (chat-formatted, as the RL stage
sends it) followed by a reference completion its verifier scores 1: the task
source's `reference(task)` where it has one (rlpt.data.sources), else
`demonstration(task)`: the gold answer in the format the RL stage rewards
(`<answer>ANSWER</answer>`; the bare answer for the synthetic task); then EOS. A task
of an episodic domain (rlpt.envs.registry) is demonstrated by its environment's
scripted episode (e.g. python_tool: call the tool with the expression, read its
output, answer), tokenized exactly as an RL episode holds it
(rlpt.envs.episode.demonstration_ids): the model's turns are trained, the tool
turns are context. The loss is the mean negative log-likelihood of the
demonstration tokens (prompt and environment tokens are context only; a source
with a `warmup(index)` method demonstrates those tasks instead of its train tasks), optimized with AdamW (rlpt.train.optim) in a jitted step over
`sft.batch_size` demonstrations drawn round-robin across domains.

The final weights are saved with Orbax under `directory` (WORKDIR/sft) together
with the loss curve, so a restarted run reuses them instead of training again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlpt.rollout import requests as req_lib
from rlpt.rollout.engine import GenerateRequest
from rlpt.train import checkpoint as ckpt_lib
from rlpt.train import distributed
from rlpt.train import packing
from rlpt.train.learner import logprobs_and_entropy
from rlpt.train.optim import OptimConfig, init_state, make_optimizer
from rlpt.types import Task


def demonstration(task: Task) -> str:
  """The reference completion of `task` in the answer format its verifier rewards."""
  if task.domain.startswith("synthetic"):
    return str(task.answer)
  answer = task.answer
  if task.domain.startswith("rg/") and "rg_entry" in task.metadata:
    answer = task.metadata["rg_entry"].get("answer", answer)
  return f"<answer>{answer}</answer>"


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """config.sft: steps (0 = no SFT), batch_size, lr, max_len (tokens per
  demonstration; longer ones are dropped), warmup_steps, length_multiple (batches
  are padded to a multiple of it: each distinct length is one compile)."""

  steps: int = 0
  batch_size: int = 8
  lr: float = 1e-4
  max_len: int = 256
  warmup_steps: int = 0
  length_multiple: int = 64

  def __post_init__(self):
    if (self.steps < 0 or self.batch_size < 1 or self.max_len < 2 or self.lr <= 0
        or self.length_multiple < 1):
      raise ValueError(f"config.sft: expected steps >= 0, batch_size >= 1, max_len >= 2, "
                       f"lr > 0 and length_multiple >= 1, got {self}")



def encode_demo(tokenizer: Any, task: Task, completion: str) -> tuple[list[int], list[int]]:
  """(prompt ids, completion ids + EOS) of one demonstration. The prompt is the task's
  chat messages rendered as the rollout engine renders an RL request."""
  from rlpt.envs import episode as ep_lib
  prompt = req_lib.prompt_ids(GenerateRequest(messages=task.messages()), tokenizer, 0)
  comp = list(tokenizer.encode(completion))
  eos = ep_lib.stop_token_id(tokenizer)
  if eos is not None:
    comp.append(eos)
  return prompt, comp


def pack_demos(demos: list[tuple], *, pad_id: int, length_multiple: int = 16):
  """Right-padded tokens, attention mask and loss mask [B, T] of demonstrations
  (prompt ids, completion ids[, completion mask]): the loss covers the completion's
  tokens (those its mask marks, when it has one)."""
  T = max(len(d[0]) + len(d[1]) for d in demos)
  T = -(-T // length_multiple) * length_multiple
  tokens = np.full((len(demos), T), pad_id, np.int32)
  attn = np.zeros((len(demos), T), bool)
  loss = np.zeros((len(demos), T), bool)
  for b, d in enumerate(demos):
    p, c = d[0], d[1]
    tokens[b, :len(p) + len(c)] = p + c
    attn[b, :len(p) + len(c)] = True
    loss[b, len(p):len(p) + len(c)] = d[2] if len(d) > 2 else True
  return tokens, attn, loss


def episode_demo(tokenizer: Any, task: Task, episodes: Any = None, renderer: Any = None
                 ) -> tuple[list[int], list[int], list[bool]] | None:
  """(prompt ids, ids, mask) of the scripted episode of `task`'s environment, or None
  when its domain is single-turn or has no demonstration. renderer: the tokenizer's
  rlpt.envs.episode.Renderer, when the caller holds one."""
  from rlpt.envs import episode as ep_lib
  from rlpt.envs import registry as env_registry
  from rlpt.train import generation
  spec = env_registry.get(task.domain)
  if spec is None or spec.demonstration is None:
    return None
  episodes = episodes or generation.EpisodeSettings()
  return ep_lib.demonstration_ids(renderer or ep_lib.Renderer(tokenizer),
                                  generation.opening(task, episodes),
                                  spec.demonstration(task))


def _nll(params, graphdef, pk: packing.Packed):
  model = nnx.merge(graphdef, params)
  lp, _, _ = logprobs_and_entropy(model, pk.tokens, pk.positions, pk.segments, pk.src,
                                  pk.targets, with_entropy=False)
  m = pk.loss_mask.astype(jnp.float32)
  return -jnp.sum(lp * m) / jnp.maximum(m.sum(), 1.0)


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 3))
def sft_step(graphdef, tx, params, opt_state, pk: packing.Packed):
  """One AdamW step on the mean demonstration NLL of a packed batch (one sequence per
  demonstration, logits only at demonstration tokens: rlpt.train.packing); returns
  (params, opt_state, loss)."""
  loss, grads = jax.value_and_grad(_nll)(params, graphdef, pk)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def _demo_stream(sources: Mapping[str, Any], tokenizer, cfg: SFTConfig, offset: int):
  """Yields encoded demonstrations round-robin across domains (training tasks
  `offset`, `offset`+1, ... of each source; too-long ones are skipped)."""
  from rlpt.envs import episode as ep_lib
  domains = sorted(sources)
  renderer = ep_lib.Renderer(tokenizer) if getattr(tokenizer, "chat_template", None) else None
  i = offset
  while True:
    for d in domains:
      warmup = getattr(sources[d], "warmup", None)
      t = warmup(i) if warmup is not None else sources[d].train(i)
      demo = episode_demo(tokenizer, t, renderer=renderer)
      if demo is None:
        reference = getattr(sources[d], "reference", None)
        text = reference(t) if reference is not None else None
        if text is None:
          text = demonstration(t)
        demo = encode_demo(tokenizer, t, text)
      if len(demo[0]) + len(demo[1]) <= cfg.max_len:
        yield demo
    i += 1


def run_sft(model: Any, tokenizer: Any, sources: Mapping[str, Any], cfg: SFTConfig,
            directory: str, *, pad_id: int = 0, log=None, mesh=None) -> dict[str, Any]:
  """Trains `model` in place on demonstrations (or restores a finished SFT from
  `directory`). Returns {"steps", "losses", "seconds", "restored"}. With a `mesh` whose
  "seq" axis is > 1 each demonstration is split over it (ring attention)."""
  graphdef, params = nnx.split(model)
  ck = ckpt_lib.Checkpointer(directory, keep=1)
  summary_path = os.path.join(directory, "sft_summary.json")
  info = ck.restore({"params": params}) if os.path.exists(summary_path) else None
  if info is not None and info.step == cfg.steps:
    nnx.update(model, info.state["params"])
    ck.close()
    with open(summary_path) as f:
      return dict(json.load(f), restored=True)
  tx = make_optimizer(OptimConfig(lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                                  total_steps=max(cfg.steps, 1), max_grad_norm=1.0))
  opt_state = (jax.jit(tx.init)(params) if mesh is None
               else init_state(tx, params, rest=jax.sharding.NamedSharding(
                   mesh, jax.sharding.PartitionSpec())))
  # Training tasks far past what the RL stage draws early, so SFT and RL prompts differ.
  stream = _demo_stream(sources, tokenizer, cfg, offset=1_000_000)
  seq = 1 if mesh is None else int(mesh.shape.get("seq", 1))
  multiple = int(np.lcm(cfg.length_multiple, 2 * seq))   # ring attention: 2 x seq chunks
  in_mesh = (lambda: jax.set_mesh(mesh)) if seq > 1 else contextlib.nullcontext
  losses, t0 = [], time.perf_counter()
  for step in range(cfg.steps):
    batch = [next(stream) for _ in range(cfg.batch_size)]
    tokens, attn, lmask = pack_demos(batch, pad_id=pad_id, length_multiple=multiple)
    pk = packing.pack(tokens, attn, lmask, share_prompts=False,
                      length_multiple=multiple, window_multiple=16)
    if jax.process_count() > 1:   # every process holds the batch: a replicated global array
      repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      pk = jax.tree.map(lambda x: distributed.global_array(x, repl), pk)
    with in_mesh():
      params, opt_state, loss = sft_step(graphdef, tx, params, opt_state, pk)
    losses.append(float(distributed.host_value(loss)))
    if log is not None:
      log(step + 1, losses[-1])
  nnx.update(model, params)
  result = {"steps": cfg.steps, "losses": losses, "seconds": time.perf_counter() - t0}
  ck.save(cfg.steps, {"params": params})
  ck.close()
  if distributed.is_primary():
    tmp = summary_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(result, f)
    os.replace(tmp, summary_path)
  distributed.barrier("sft_summary")
  return dict(result, restored=False)
