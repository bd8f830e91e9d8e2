"""Config-file flags with errors a person can act on.

Every launcher defines `--config` with `config_flags.DEFINE_config_file(...,
lock_config=True)` and starts through `run(main)`. Before absl parses anything we
load the config file ourselves and check every `--config.a.b=v` override against
it, so a typo, a missing file or a wrong type ends with one line naming the file,
the field and what was expected (and the closest valid names), exit status 2.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys
from typing import Callable, Sequence

from absl import app, flags
import ml_collections


class ConfigError(Exception):
  """A config file or override is unusable; the message says why."""


def leaf_paths(cfg: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Dotted paths of every field of `cfg` (interior dicts included)."""
  out = []
  for k in sorted(cfg.keys()):
    path = f"{prefix}{k}"
    out.append(path)
    v = cfg[k]
    if isinstance(v, ml_collections.ConfigDict):
      out.extend(leaf_paths(v, path + "."))
  return out


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """Loads `path[:arg]` by calling its `get_config(arg)`."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    here = os.path.dirname(path) or "."
    near = sorted(f for f in os.listdir(here) if f.endswith(".py")) if os.path.isdir(here) else []
    hint = difflib.get_close_matches(os.path.basename(path), near, n=3, cutoff=0.4)
    raise ConfigError(f"config file '{path}' not found"
                      + (f"; did you mean {', '.join(os.path.join(here, h) for h in hint)}?" if hint
                         else f" (looked in {os.path.abspath(here)})"))
  mod_spec = importlib.util.spec_from_file_location("_rlpt_config_under_check", path)
  module = importlib.util.module_from_spec(mod_spec)
  try:
    mod_spec.loader.exec_module(module)
  except Exception as e:  # noqa: BLE001 -- any error in user config code is reported
    raise ConfigError(f"config file '{path}' failed to import: {type(e).__name__}: {e}") from e
  if not hasattr(module, "get_config"):
    raise ConfigError(f"config file '{path}' defines no get_config(arg=None)")
  try:
    cfg = module.get_config(arg or None) if arg else module.get_config()
  except Exception as e:  # noqa: BLE001
    raise ConfigError(f"config file '{path}': get_config({arg!r}) raised "
                      f"{type(e).__name__}: {e}") from e
  if not isinstance(cfg, ml_collections.ConfigDict):
    raise ConfigError(f"config file '{path}': get_config must return an "
                      f"ml_collections.ConfigDict, got {type(cfg).__name__}")
  return cfg


def check_overrides(argv: Sequence[str], flag_name: str = "config") -> None:
  """Validates `--config=...` and each `--config.x.y=v` in argv before absl sees them."""
  spec = None
  overrides = []
  args = list(argv[1:])
  for i, a in enumerate(args):
    if a == "--":
      break
    if a.startswith(f"--{flag_name}="):
      spec = a.split("=", 1)[1]
    elif a == f"--{flag_name}" and i + 1 < len(args):
      spec = args[i + 1]
    elif a.startswith(f"--{flag_name}."):
      overrides.append(a[len(f"--{flag_name}."):].split("=", 1)[0])
  if spec is None:
    if overrides:
      raise ConfigError(f"--{flag_name}.{overrides[0]} given without --{flag_name}=FILE")
    return
  cfg = load_config_file(spec)
  valid = leaf_paths(cfg)
  for field in overrides:
    if field not in valid:
      raise ConfigError(unknown_field_message(
          field, valid, f"from --{flag_name}.{field}=...; config file '{spec.partition(':')[0]}'"))


def unknown_field_message(field: str, valid: Sequence[str], where_from: str) -> str:
  """"unknown config field 'F' (WHERE_FROM). Closest valid names: ..." for a dotted
  `field` that is not among `valid` (leaf_paths of the config)."""
  parent, _, name = field.rpartition(".")
  siblings = [p for p in valid if p.rpartition(".")[0] == parent]
  close = difflib.get_close_matches(field, valid, n=5, cutoff=0.6)
  close += [s for s in difflib.get_close_matches(name, [s.rpartition(".")[2] for s in siblings],
                                                 n=3, cutoff=0.5)
            if (f"{parent}.{s}" if parent else s) not in close]
  close = [c if "." in c or not parent else f"{parent}.{c}" for c in close]
  where = f"'{parent}'" if parent else "the top level"
  msg = f"unknown config field '{field}' ({where_from})"
  if close:
    return msg + f". Closest valid names: {', '.join(dict.fromkeys(close))}"
  if parent and parent not in valid:
    return msg + f". '{parent}' is not a config group either"
  return msg + f". Fields at {where}: {', '.join(s.rpartition('.')[2] for s in siblings[:20])}"


def _parse(argv: list[str]) -> list[str]:
  prog = os.path.basename(argv[0]) if argv else "launch"
  try:
    check_overrides(argv)
    return flags.FLAGS(argv)
  except ConfigError as e:
    sys.stderr.write(f"{prog}: config error: {e}\n")
  except flags.Error as e:
    sys.stderr.write(f"{prog}: flag error: {e}{_expected_type(argv, str(e))}\n"
                     f"Pass --helpshort to see the flags.\n")
  sys.exit(2)


def _expected_type(argv: Sequence[str], message: str) -> str:
  """' (field X of FILE expects T, default D)' for a bad --config.X value."""
  m = re.search(r"--config\.([\w.]+)=", message)
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if not m or spec is None:
    return ""
  try:
    value = load_config_file(spec)
    for part in m.group(1).split("."):
      value = value[part]
  except (ConfigError, KeyError, AttributeError):
    return ""
  return (f" (field '{m.group(1)}' of '{spec.partition(':')[0]}' expects "
          f"{type(value).__name__}, default {value!r})")


def run(main: Callable[[list[str]], None]) -> None:
  """`app.run(main)` with the config checks above."""
  app.run(main, flags_parser=_parse)
