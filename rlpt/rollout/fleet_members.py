"""Fleet member specs and what runs inside a member's Ray actor.

  ServerSpec / UrlSpec / EngineSpec   how a member is made (see rlpt.rollout.fleet)
  ServerProcess   a `python -m rlpt.rollout.server_main` child on 127.0.0.1 (the server
                  launch.serve runs): started, health-checked, restarted on the same
                  port; dies with the actor (PR_SET_PDEATHSIG).
  EngineHost      a JaxEngine whose concurrent `generate` calls share one batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from rlpt.rollout.engine import Completion, GenerateRequest
from rlpt.rollout.server_main import ServeSettings


class FleetError(RuntimeError):
  """The fleet cannot do what was asked (no member left, a weight update refused)."""


class MemberDown(RuntimeError):
  """A member failed while serving a request (the request will be re-dispatched)."""


@dataclasses.dataclass(frozen=True)
class ServerSpec:
  """A rollout server process (`python -m rlpt.rollout.server_main`) owned by a Ray actor.

  Attributes:
    settings: what it serves (ServeSettings: model, engine sizes, start weights); the
      actor chooses the port.
    env: extra environment for the server process.
    startup_timeout_s: how long a (re)start may take until /health answers.
    log_dir: where the server's stdout/stderr go (default: a temp dir).
  """

  settings: ServeSettings = ServeSettings()
  env: tuple[tuple[str, str], ...] = ()
  startup_timeout_s: float = 300.0
  log_dir: str | None = None


@dataclasses.dataclass(frozen=True)
class UrlSpec:
  """An SGLang-native server that is already running at `url`.

  Attributes:
    url: e.g. "http://10.0.0.5:30000".
    load_hf: the server loads HF checkpoints (a real SGLang server): weight updates
      send the published version's HF copy (`publish.hf_path`, "<vN>.hf") instead
      of the Orbax directory.
    startup_timeout_s: how long the fleet waits for its /health to answer 200.
  """

  url: str
  load_hf: bool = False
  startup_timeout_s: float = 60.0


@dataclasses.dataclass(frozen=True)
class EngineSpec:
  """A JaxEngine in a Ray actor: `JaxEngine.from_pretrained(model, JaxEngineConfig(**engine))`."""

  model: str = "smollm2-135m-instruct"
  engine: tuple[tuple[str, Any], ...] = ()
  dtype: str = "float32"


def _node_id() -> str | None:
  """The Ray node this actor runs on (None outside Ray)."""
  try:
    import ray
    return ray.get_runtime_context().get_node_id()
  except Exception:  # noqa: BLE001 -- not in a Ray worker
    return None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _die_with_parent() -> None:
  """In the child: SIGKILL me when the process that started me exits (Linux)."""
  try:
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except OSError:
    pass


class ServerProcess:
  """One rollout server child process on 127.0.0.1 (run inside a Ray actor)."""

  def __init__(self, settings_json: str, env: dict[str, str] | None = None,
               startup_timeout_s: float = 300.0, log_dir: str | None = None,
               cwd: str | None = None):
    import tempfile
    self.settings_json = settings_json
    self.env = dict(env or {})
    self.startup_timeout_s = startup_timeout_s
    self.log_dir = log_dir or tempfile.mkdtemp(prefix="rlpt-serve-")
    self.cwd = cwd or os.getcwd()
    self.port = _free_port()
    self.proc: subprocess.Popen | None = None
    self.starts = 0

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"

  def pid(self) -> int | None:
    return self.proc.pid if self.proc is not None else None

  def alive(self) -> bool:
    return self.proc is not None and self.proc.poll() is None

  def start(self) -> int:
    """Starts the process (if not running) and waits until /health answers 200."""
    import urllib.request
    if not self.alive():
      self.starts += 1
      log = open(os.path.join(self.log_dir, f"serve-{self.port}-{self.starts}.log"), "ab")
      cmd = [sys.executable, "-m", "rlpt.rollout.server_main",
             f"--settings={self.settings_json}", f"--port={self.port}", "--host=127.0.0.1"]
      self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                   env={**os.environ, **self.env}, preexec_fn=_die_with_parent)
      log.close()
    deadline = time.monotonic() + self.startup_timeout_s
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        raise FleetError(f"rollout server on port {self.port} exited with "
                         f"{self.proc.returncode}; log: {self._log_tail()}")
      try:
        with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
          if r.status == 200:
            return self.proc.pid
      except OSError:
        pass
      time.sleep(0.2)
    raise FleetError(f"rollout server on port {self.port} not healthy within "
                     f"{self.startup_timeout_s} s; log: {self._log_tail()}")

  def _log_tail(self, chars: int = 1500) -> str:
    """The end of the current start's log (it names the cause), with its path."""
    path = os.path.join(self.log_dir, f"serve-{self.port}-{self.starts}.log")
    try:
      with open(path, errors="replace") as f:
        text = f.read()[-chars:]
    except OSError:
      text = ""
    return f"{path}\n{text}"

  def info(self) -> dict[str, Any]:
    return {"url": self.url, "pid": self.pid(), "alive": self.alive(), "starts": self.starts,
            "log_dir": self.log_dir, "node_id": _node_id()}

  def stop(self) -> None:
    if self.alive():
      self.proc.terminate()
      try:
        self.proc.wait(10)
      except subprocess.TimeoutExpired:
        self.proc.kill()


class EngineHost:
  """A JaxEngine whose concurrent `generate` calls share batches (the body of EngineActor)."""

  def __init__(self, spec: EngineSpec):
    import concurrent.futures
    from rlpt.rollout.jax_engine import JaxEngine, JaxEngineConfig
    self.engine = JaxEngine.from_pretrained(spec.model, JaxEngineConfig(**dict(spec.engine)),
                                            dtype=spec.dtype)
    self._device = concurrent.futures.ThreadPoolExecutor(1)
    self._pending: list[tuple[list[GenerateRequest], asyncio.Future]] = []
    self._busy = False

  def pid(self) -> int:
    return os.getpid()

  def node_id(self) -> str | None:
    return _node_id()

  def weight_version(self) -> int:
    return self.engine.weight_version

  async def generate(self, requests: list[GenerateRequest]) -> list[Completion]:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    self._pending.append((list(requests), fut))
    if not self._busy:
      self._busy = True
      try:
        while self._pending:
          batch, self._pending = self._pending, []
          flat = [r for reqs, _ in batch for r in reqs]
          try:
            comps = await loop.run_in_executor(self._device, self.engine.generate, flat)
          except Exception as e:  # noqa: BLE001 -- handed to every caller of the batch
            for _, f in batch:
              f.set_exception(e)
            continue
          at = 0
          for reqs, f in batch:
            k = sum(r.n for r in reqs)
            f.set_result(comps[at:at + k])
            at += k
      finally:
        self._busy = False
    return await fut

  async def update_weights(self, path: str, version: int):
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(self._device, self.engine.update_weights, path, version)
