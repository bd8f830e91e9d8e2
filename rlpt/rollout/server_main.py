"""The rollout server process: one JaxEngine behind SGLang's native HTTP API.

    python -m rlpt.rollout.server_main --settings='{"model": "DIR", ...}' --port=PORT

`launch.serve` (a config file's fields) and every fleet server member
(`rlpt.rollout.fleet.ServerSpec`) start this same server: `ServeSettings` says what
to serve, `build_server` loads it, `serve` answers HTTP until the process is killed.
It is ready when `GET /health` answers 200 (weights loaded, common shapes compiled).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from absl import logging

from rlpt.rollout.jax_engine import JaxEngineConfig


@dataclasses.dataclass(frozen=True)
class ServeSettings:
  """What one server serves.

  Attributes:
    model: a `rlpt.models.load_model` path (HF directory, .gguf file or a known name).
    dtype: compute dtype of the engine.
    engine: the JaxEngine's sizes.
    served_model_name: what /get_model_info reports ("" = `model`).
    default_max_new_tokens: used when a request leaves max_new_tokens null.
    max_batch_prompts: prompts per engine.generate batch.
    max_batch_samples: samples (prompts x n) per engine.generate batch (0: no cap).
    warmup: compile the common shapes before answering /health.
    weights_path / weights_version: an Orbax params checkpoint to load at start
      (e.g. WORKDIR/weights/vN) and the version to report ("" = the model's own).
    seed: seeds requests that bring none.
    gather_quiet_s / gather_max_s: how long the server lets a burst of requests
      arrive before it forms a batch (rlpt.rollout.server.EngineServer; 0 = off).
  """

  model: str = "smollm2-135m-instruct"
  dtype: str = "float32"
  engine: JaxEngineConfig = JaxEngineConfig(max_batch=32, max_len=2048, kv_cache_mib=1024.0)
  served_model_name: str = ""
  default_max_new_tokens: int = 128
  max_batch_prompts: int = 64
  max_batch_samples: int = 0
  warmup: bool = True
  weights_path: str = ""
  weights_version: int = 0
  seed: int = 0
  gather_quiet_s: float = 0.005
  gather_max_s: float = 0.05

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "ServeSettings":
    d = json.loads(text)
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise ValueError(f"ServeSettings: unknown fields {unknown}")
    if "engine" in d:
      d["engine"] = JaxEngineConfig(**d["engine"])
    return cls(**d)


def build_server(settings: ServeSettings):
  """(EngineServer, JaxEngine) for `settings`: loads the model and the start weights."""
  from rlpt.models import load_model
  from rlpt.rollout.jax_engine import JaxEngine
  from rlpt.rollout.server import EngineServer, weight_loader

  t0 = time.perf_counter()
  model, tokenizer = load_model(settings.model, dtype=settings.dtype)
  engine = JaxEngine(model, tokenizer, dataclasses.replace(settings.engine, seed=settings.seed))
  del model
  if settings.weights_path:
    engine.update_weights(os.path.abspath(settings.weights_path), settings.weights_version)
  logging.info("loaded %s in %.1f s", settings.model, time.perf_counter() - t0)
  server = EngineServer(
      engine, tokenizer, weights=lambda: (engine.model_config, engine.params),
      vocab_size=engine.model_config.vocab_size, model_path=settings.model,
      max_context=min(settings.engine.max_len, engine.model_config.max_position_embeddings),
      load_weights=weight_loader(engine, dtype=settings.dtype),
      served_model_name=settings.served_model_name or settings.model,
      default_max_new_tokens=settings.default_max_new_tokens,
      max_batch_prompts=settings.max_batch_prompts,
      max_batch_samples=settings.max_batch_samples,
      server_args={"serve_settings": json.loads(settings.to_json())}, seed=settings.seed,
      gather_quiet_s=settings.gather_quiet_s, gather_max_s=settings.gather_max_s)
  return server, engine


def serve(settings: ServeSettings, *, host: str = "127.0.0.1", port: int = 30000) -> None:
  """Builds the server, compiles (if `warmup`) and serves until killed. A model or
  weights path that cannot be loaded ends the process with one line naming it."""
  from aiohttp import web
  try:
    server, _ = build_server(settings)
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f"rlpt server: cannot start: {type(e).__name__}: {e}") from None
  if settings.warmup:
    t0 = time.perf_counter()
    server.warmup()
    logging.info("warm-up compiled in %.1f s", time.perf_counter() - t0)
  print(f"rlpt server: serving {settings.model} on http://{host}:{port}", flush=True)
  web.run_app(server.app(), host=host, port=port, print=None, access_log=None)


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(prog="python -m rlpt.rollout.server_main",
                              description="Serve a JaxEngine over SGLang's native HTTP API.")
  p.add_argument("--settings", required=True, help="ServeSettings as JSON")
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--port", type=int, required=True)
  a = p.parse_args(argv)
  try:
    settings = ServeSettings.from_json(a.settings)
  except (ValueError, TypeError) as e:
    raise SystemExit(f"rlpt server: bad --settings: {e}") from None
  logging.set_verbosity(logging.INFO)
  serve(settings, host=a.host, port=a.port)


if __name__ == "__main__":
  main(sys.argv[1:])

