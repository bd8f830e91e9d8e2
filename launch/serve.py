r"""Serves a JaxEngine over SGLang's native HTTP API until killed.

  python -m launch.serve --config=configs/serve.py [--config.key=value ...] --port=PORT

Ready when `GET /health` answers 200 (weights loaded, common shapes compiled).
Routes: POST /generate, POST /update_weights_from_disk, GET /health,
GET /get_model_info, GET /server_info, POST /flush_cache (see rlpt.rollout.server).
"""

import os
import time

from absl import flags, logging

from launch import config_cli

from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Serve config file.", lock_config=True)
_PORT = flags.DEFINE_integer("port", 30000, "TCP port to listen on.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")


def build_server(config):
  """(EngineServer, JaxEngine) for a serve config: loads the model and the start weights."""
  from rlpt.models import load_model
  from rlpt.rollout.jax_engine import JaxEngine, JaxEngineConfig
  from rlpt.rollout.server import EngineServer, weight_loader

  t0 = time.perf_counter()
  model, tokenizer = load_model(config.model.name, dtype=config.model.dtype)
  engine = JaxEngine(model, tokenizer, JaxEngineConfig(seed=config.seed, **config.engine.to_dict()))
  del model
  if config.weights.path:
    engine.update_weights(os.path.abspath(config.weights.path), config.weights.version)
  logging.info("loaded %s in %.1f s", config.model.name, time.perf_counter() - t0)
  server = EngineServer(
      engine, tokenizer, weights=lambda: (engine.model_config, engine.params),
      vocab_size=engine.model_config.vocab_size, model_path=config.model.name,
      max_context=min(config.engine.max_len, engine.model_config.max_position_embeddings),
      load_weights=weight_loader(engine, dtype=config.model.dtype),
      served_model_name=config.serve.served_model_name or config.model.name,
      default_max_new_tokens=config.serve.default_max_new_tokens,
      max_batch_prompts=config.serve.max_batch_prompts,
      server_args={"model_config": config.to_dict()}, seed=config.seed)
  return server, engine


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise SystemExit("--config=configs/serve.py is required")
  from aiohttp import web
  try:
    server, _ = build_server(_CONFIG.value)
  except (FileNotFoundError, ValueError) as e:  # a bad model or weights path: one clear line
    raise SystemExit(f"launch.serve: cannot start: {type(e).__name__}: {e}") from None
  if _CONFIG.value.serve.warmup:
    t0 = time.perf_counter()
    server.warmup()
    logging.info("warm-up compiled in %.1f s", time.perf_counter() - t0)
  print(f"launch.serve: serving {_CONFIG.value.model.name} on http://{_HOST.value}:{_PORT.value}",
        flush=True)
  web.run_app(server.app(), host=_HOST.value, port=_PORT.value, print=None,
              access_log=None)


if __name__ == "__main__":
  config_cli.run(main)
