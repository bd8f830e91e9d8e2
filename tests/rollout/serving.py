"""Shared by the serving tests: a tiny random model with SmolLM2's real tokenizer, an
in-process EngineServer on a free localhost port, and launch.serve subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import jax
import numpy as np

from rlpt.rollout.jax_engine import JaxEngineConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The serving tests and the launch.serve processes they start compile the same
# programs (same tiny config, same engine settings): share them through JAX's
# persistent compilation cache instead of compiling each one in every process.
COMPILE_CACHE = os.path.join(os.environ.get("TMPDIR", "/tmp"), "rlpt-test-jax-cache")
jax.config.update("jax_compilation_cache_dir", COMPILE_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def smollm2_tokenizer():
  """SmolLM2's tokenizer from its GGUF metadata (no tensors are read)."""
  from rlpt.models import gguf_file
  from rlpt.models.loading import resolve_path
  _, _, tok = gguf_file.read_gguf_checkpoint(resolve_path("smollm2-135m-instruct"))
  return tok


def tiny_config(tokenizer):
  """A 2-layer Llama over SmolLM2's full vocabulary: fast, with real text in and out."""
  from rlpt.models import ModelConfig
  return ModelConfig(arch="llama", vocab_size=tokenizer.vocab_size, hidden_size=64,
                     intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=16, max_position_embeddings=2048, tie_word_embeddings=True,
                     eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)


def tiny_model(tokenizer, seed: int = 0):
  from rlpt.models import random_model
  return random_model(tiny_config(tokenizer), seed=seed)


def perturbed(params, scale: float = 0.5, seed: int = 1):
  """Same tree, every tensor moved by `scale` x N(0, 1) noise (new, different weights)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape, x.dtype)
                                   for x, k in zip(leaves, keys)])


def tiny_engine_config():
  from rlpt.rollout import JaxEngineConfig
  return JaxEngineConfig(max_batch=8, max_len=512, kv_cache_mib=64, min_prompt_bucket=32,
                         length_multiple=32)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class InProcessServer:
  """An EngineServer over `engine`, served by aiohttp in a background thread."""

  def __init__(self, engine, tokenizer, **kw):
    from aiohttp import web
    from rlpt.rollout.server import EngineServer, weight_loader
    self.engine = engine
    self.server = EngineServer(
        engine, tokenizer, weights=lambda: (engine.model_config, engine.params),
        vocab_size=engine.model_config.vocab_size, model_path="tiny-random",
        max_context=engine.config.max_len, load_weights=weight_loader(engine), **kw)
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run():
      asyncio.set_event_loop(self.loop)
      self.runner = web.AppRunner(self.server.app())
      self.loop.run_until_complete(self.runner.setup())
      self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
      ready.set()
      self.loop.run_forever()

    self.thread = threading.Thread(target=run, daemon=True)
    self.thread.start()
    ready.wait(30)

  def close(self):
    asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
    self.loop.call_soon_threadsafe(self.loop.stop)
    self.thread.join(10)


def compile_cache_env() -> dict[str, str]:
  """Environment that makes launch.serve processes share compiled programs (one CPU device)."""
  return {"JAX_COMPILATION_CACHE_DIR": COMPILE_CACHE,
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}


def start_serve(argv, *, log_path: str, env: dict[str, str] | None = None,
                timeout_s: float = 600.0):
  """Starts `python -m launch.serve ARGV --port=P`; returns (Popen, url) once /health is 200."""
  port = free_port()
  log = open(log_path, "wb")
  proc = subprocess.Popen([sys.executable, "-m", "launch.serve", *argv, f"--port={port}"],
                          cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                          env={**os.environ, **compile_cache_env(), **(env or {})})
  url = f"http://127.0.0.1:{port}"
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"launch.serve exited with {proc.returncode}:\n"
                         + open(log_path, errors="replace").read()[-4000:])
    try:
      with urllib.request.urlopen(url + "/health", timeout=2) as r:
        if r.status == 200:
          return proc, url
    except OSError:
      pass
    time.sleep(0.3)
  proc.send_signal(signal.SIGKILL)
  raise RuntimeError(f"launch.serve not healthy in {timeout_s} s:\n"
                     + open(log_path, errors="replace").read()[-4000:])


def stop(proc) -> None:
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(15)
    except subprocess.TimeoutExpired:
      proc.kill()


def post(url: str, path: str, payload) -> tuple[int, object]:
  """Plain blocking POST (urllib, independent of our client); returns (status, JSON)."""
  import json
  req = urllib.request.Request(url + path, data=json.dumps(payload).encode(),
                               headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=300) as r:
      body = r.read()
      try:
        return r.status, json.loads(body or b"null")
      except ValueError:
        return r.status, body.decode()
  except urllib.error.HTTPError as e:
    body = e.read()
    try:
      return e.code, json.loads(body)
    except ValueError:
      return e.code, body.decode()


def get(url: str, path: str) -> tuple[int, object]:
  import json
  try:
    with urllib.request.urlopen(url + path, timeout=60) as r:
      body = r.read()
      try:
        return r.status, json.loads(body)
      except ValueError:
        return r.status, body.decode()
  except urllib.error.HTTPError as e:
    return e.code, e.read().decode()


def as_np(x):
  return np.asarray(x, np.float64)


def save_tiny_hf(path: str, tokenizer, seed: int = 0) -> str:
  """Writes the tiny random model as an HF checkpoint directory (what launch.serve loads)."""
  from rlpt.models.hf_checkpoint import save_hf
  save_hf(tiny_model(tokenizer, seed), tokenizer, path)
  return path


# The engine sizes of the tiny servers (ServeSettings.engine).
TINY_ENGINE = JaxEngineConfig(max_batch=8, max_len=512, kv_cache_mib=64.0, min_prompt_bucket=32,
                              length_multiple=32)
