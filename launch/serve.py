r"""Serves a JaxEngine over SGLang's native HTTP API until killed.

  python -m launch.serve --config=configs/serve.py [--config.key=value ...] --port=PORT

The config file's fields become `rlpt.rollout.server_main.ServeSettings`, and the
server is the one every fleet member runs (`rlpt.rollout.server_main`). Ready when
`GET /health` answers 200 (weights loaded, common shapes compiled). Routes: POST
/generate, POST /update_weights_from_disk, GET /health, GET /get_model_info, GET
/server_info, POST /flush_cache (see rlpt.rollout.server); OpenAI's GET /v1/models,
POST /v1/completions, POST /v1/chat/completions, POST /tokenize, POST /detokenize, GET
/tokenizer_info (rlpt.rollout.openai_api), so the `openai` client and lm-eval's
local-completions can drive it.
"""

from absl import flags

from launch import config_cli

from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Serve config file.", lock_config=True)
_PORT = flags.DEFINE_integer("port", 30000, "TCP port to listen on.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")


def serve_settings(config):
  """ServeSettings of a configs/serve.py-style config (model.*, engine.*, serve.*,
  weights.*, seed)."""
  from rlpt.rollout.jax_engine import JaxEngineConfig
  from rlpt.rollout.server_main import ServeSettings
  return ServeSettings(
      model=str(config.model.name), dtype=str(config.model.dtype),
      engine=JaxEngineConfig(**config.engine.to_dict()),
      served_model_name=str(config.serve.served_model_name),
      default_max_new_tokens=int(config.serve.default_max_new_tokens),
      max_batch_prompts=int(config.serve.max_batch_prompts), warmup=bool(config.serve.warmup),
      weights_path=str(config.weights.path), weights_version=int(config.weights.version),
      seed=int(config.seed))


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise SystemExit("--config=configs/serve.py is required")
  from rlpt.rollout import server_main
  try:
    settings = serve_settings(_CONFIG.value)
  except (TypeError, ValueError) as e:
    raise SystemExit(f"launch.serve: config error: {e}") from None
  server_main.serve(settings, host=_HOST.value, port=_PORT.value)


if __name__ == "__main__":
  config_cli.run(main)
