"""A fleet of rollout servers (or in-process engines) driven through Ray actors.

    fleet = Fleet([ServerSpec(ServeSettings(model=DIR))] * 2)   # ray.init() inside
    completions = fleet.generate(requests)          # routed, retried, exactly once
    fleet.update_weights(publisher.publish(params, 3).path, 3)   # every member acks v3
    fleet.shutdown()

`Fleet` is a `RolloutEngine`: the RL loop drives it exactly as it drives the embedded
JaxEngine, except that its weights arrive as the path of a published Orbax version
(rlpt.train.publish, through rlpt.train.weight_sync), never as arrays.

Members:
  ServerSpec  a Ray actor that owns one rollout server process
              (`python -m rlpt.rollout.server_main`, the server launch.serve runs) on
              127.0.0.1 (started, health-checked, restarted when it dies); the
              driver talks SGLang's native API to it with `SGLangClient`.
  UrlSpec     an already running SGLang-native server (a real `sglang.launch_server`
              or launch.serve elsewhere); health-checked, not restartable.
  EngineSpec  a Ray actor holding a JaxEngine in its own process; concurrent calls
              are batched into one `generate`.

Routing: a request and all its n samples go to one member (so they share the
prefill / prefix cache), the member with the fewest outstanding tokens
(n x (prompt + max_new_tokens) summed over its unfinished requests). A failed
member (connection lost, process gone) is marked down and restarted in the
background; its unfinished requests are dispatched again to the healthy members.
Each request's result is taken once, so every request completes exactly once.

Weights: `update_weights(path, version)` sends the Orbax path to every member and
returns once each has acknowledged `version`; a restarted member is brought to
the current version before it takes work. In-flight requests finish on the old
weights (`abort_inflight=False`, completions carry the old version), are
aborted and re-queued to run on the new weights (`abort_inflight=True`), or go on
under the new weights from their next decode chunk (`continue_inflight=True`:
partial rollouts; `Completion.token_versions` tags every token with the version that
sampled it, `weight_version` is the first token's).
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from typing import Any, Sequence

from absl import logging

from rlpt.rollout.client import SGLangClient, SGLangError, SGLangRequestError
from rlpt.rollout.engine import Completion, GenerateRequest, RolloutEngine, WeightUpdateStats
from rlpt.rollout.fleet_members import (EngineHost, EngineSpec, FleetError, MemberDown,
                                        ServerProcess, ServerSpec, UrlSpec)

__all__ = ["EngineSpec", "Fleet", "FleetError", "MemberDown", "ServerSpec", "UrlSpec"]


def _is_ray_error(e: BaseException) -> bool:
  """An error Ray raised about an actor or its node (RayActorError, ActorDiedError,
  ...): the member is gone, not the request."""
  return type(e).__module__.startswith("ray")


def _cost(r: GenerateRequest) -> int:
  prompt = (len(r.prompt_ids) if r.prompt_ids is not None
            else len(r.text or "") // 4 + 1 if r.text is not None
            else sum(len(m.get("content", "")) for m in r.messages) // 4 + 8)
  return r.n * (prompt + r.sampling.max_new_tokens)


class _Member:
  """Driver-side view of one member: how to reach it and its routing state."""

  def __init__(self, index: int, spec: Any):
    self.index = index
    self.spec = spec
    self.actor = None
    self.client: SGLangClient | None = None
    self.healthy = False
    self.outstanding = 0
    self.version: int | None = None
    self.restarts = 0
    self.restarting: asyncio.Task | None = None
    self.served = 0
    self.health_misses = 0   # consecutive /health checks that got no answer

  @property
  def restartable(self) -> bool:
    return not isinstance(self.spec, UrlSpec)


class Fleet(RolloutEngine):
  """Routes rollout requests over members; see the module docstring.

  Args:
    members: one spec per member (ServerSpec, UrlSpec or EngineSpec).
    ray_address: join this Ray cluster; None or "" starts a local one
      (`ray.init(num_cpus=num_cpus, include_dashboard=False)`).
    num_cpus: CPUs of the local Ray instance.
    request_timeout_s: per HTTP request.
    health_interval_s: period of the background health checks (0 = off).
    health_misses: consecutive unanswered /health checks (5 s each) before a member
      whose process is still alive is declared down. A server busy with a flood of
      queued requests (a 1,200-task holdout) can miss one; a member whose process
      died, or whose actor is gone, is down at the first check.
    client_retries: transient-failure retries inside SGLangClient before a member
      is declared down.
    max_attempts: dispatches per request before the fleet gives up on it.
    tokenizer: renders chat messages for server members (their /generate takes text).
    batch_samples: routing unit. 0: each request goes to the member with the least
      outstanding work. > 0: a `generate` call's requests are cut, in order, into
      runs of at most this many samples, and each run goes to one member (the one
      with the least outstanding work when the call arrives), so a member gets whole
      batches: an RL round of 12 prompts x 8 samples stays on one member instead of
      six prompts on each (two half-empty batches, each reading all the weights every
      decode step). Retries of a request whose member went down are routed alone.
    placement: where member actors go. "none": no resources asked (num_cpus=0; any
      node, today's local fleets). "auto": on a cluster joined with `ray_address`, one
      GPU per member when the cluster has a GPU for each, else one CPU per member,
      spread over the nodes (SPREAD); on a local Ray, "none". Or a dict of
      `ray.remote` resources for each member, e.g. {"num_gpus": 1}, also spread.
  """

  def __init__(self, members: Sequence[Any], *, ray_address: str | None = None,
               num_cpus: int = 2, request_timeout_s: float = 600.0,
               health_interval_s: float = 2.0, client_retries: int = 2,
               max_attempts: int = 5, tokenizer: Any = None, placement: Any = "auto",
               health_misses: int = 3, batch_samples: int = 0):
    if not members:
      raise ValueError("Fleet needs at least one member spec")
    import ray
    self._ray = ray
    self._own_ray = False
    if not ray.is_initialized():
      if ray_address:
        ray.init(address=ray_address)
      else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        self._own_ray = True
    self.request_timeout_s = request_timeout_s
    self.batch_samples = int(batch_samples)
    self.health_interval_s = health_interval_s
    self.health_misses = max(int(health_misses), 1)
    self.client_retries = client_retries
    self.max_attempts = max_attempts
    self.tokenizer = tokenizer
    self.resources = self._placement(placement, len(members), bool(ray_address))
    self.members = [_Member(i, s) for i, s in enumerate(members)]
    self.current: tuple[str, int] | None = None
    self.stats = collections.Counter()
    self._loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self._loop.run_forever, name="rlpt-fleet", daemon=True)
    self._thread.start()
    self._health_task = None
    try:
      self._call(self._start_all())
    except BaseException:
      self.shutdown()
      raise
    if health_interval_s > 0:
      self._health_task = asyncio.run_coroutine_threadsafe(self._health_loop(), self._loop)

  # --- plumbing ----------------------------------------------------------------

  def _call(self, coro, timeout: float | None = None):
    return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

  def _placement(self, placement: Any, n: int, joined: bool) -> dict[str, Any]:
    """The `ray.remote` options of every member actor (see `placement`)."""
    if isinstance(placement, dict):
      return dict(placement, scheduling_strategy="SPREAD")
    if placement not in ("auto", "none"):
      raise ValueError(f"Fleet placement={placement!r}: expected 'auto', 'none' or a dict of "
                       "ray.remote resources")
    if placement == "none" or not joined:
      return {"num_cpus": 0}
    res = self._ray.cluster_resources()
    if res.get("GPU", 0) >= n:
      return {"num_cpus": 0, "num_gpus": 1, "scheduling_strategy": "SPREAD"}
    if res.get("CPU", 0) >= n:
      return {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
    # fewer CPUs than members: reserving one each would leave actors pending forever
    logging.warning("fleet: the Ray cluster has %s CPUs for %d members; members reserve "
                    "none and are only spread over the nodes", res.get("CPU", 0), n)
    return {"num_cpus": 0, "scheduling_strategy": "SPREAD"}

  def _make_actor(self, spec):
    ray = self._ray
    opts = dict(self.resources, max_restarts=0)
    if isinstance(spec, ServerSpec):
      cls = ray.remote(ServerProcess).options(**opts)
      return cls.remote(spec.settings.to_json(), dict(spec.env), spec.startup_timeout_s,
                        spec.log_dir, os.getcwd())
    if isinstance(spec, EngineSpec):
      cls = ray.remote(EngineHost).options(**opts, max_concurrency=64)
      return cls.remote(spec)
    raise TypeError(f"unknown member spec {spec!r}")

  async def _start_member(self, m: _Member) -> None:
    spec = m.spec
    if isinstance(spec, UrlSpec):
      url = spec.url
    else:
      if m.actor is None:
        m.actor = self._make_actor(spec)
      if isinstance(spec, ServerSpec):
        await m.actor.start.remote()
        url = (await m.actor.info.remote())["url"]
      else:
        url = None
    if url is not None and m.client is None:
      m.client = SGLangClient(url, timeout_s=self.request_timeout_s,
                              max_retries=self.client_retries, backoff_s=0.2,
                              tokenizer=self.tokenizer)
    if m.client is not None:
      await m.client.wait_healthy(timeout_s=getattr(spec, "startup_timeout_s", 60.0))
    if self.current is not None:  # a (re)started member catches up with the fleet
      await self._update_member(m, *self.current, abort=False)
    m.version = await self._member_version(m)
    m.healthy = True

  async def _start_all(self) -> None:
    """Starts every member; the first that cannot start fails the fleet with a
    FleetError naming it (index, URL or kind) and the cause."""
    results = await asyncio.gather(*(self._start_member(m) for m in self.members),
                                   return_exceptions=True)
    for m, r in zip(self.members, results):
      if isinstance(r, BaseException):
        where = m.spec.url if isinstance(m.spec, UrlSpec) else type(m.spec).__name__
        cause = getattr(r, "cause", None) or r  # a Ray actor's error: the actor's exception
        raise FleetError(f"fleet member {m.index} ({where}) did not start: "
                         f"{type(cause).__name__}: {cause}") from r

  async def _member_version(self, m: _Member) -> int | None:
    if m.client is not None:
      v = await m.client.weight_version(retries=1)
      try:
        return int(v)
      except (TypeError, ValueError):
        return None
    return await m.actor.weight_version.remote()

  def _mark_down(self, m: _Member, why: str) -> None:
    if not m.healthy and m.restarting is not None and not m.restarting.done():
      return
    m.healthy = False
    self.stats["member_failures"] += 1
    logging.warning("fleet member %d down: %s", m.index, why)
    if m.restartable and (m.restarting is None or m.restarting.done()):
      m.restarting = self._loop.create_task(self._restart(m))

  async def _restart(self, m: _Member) -> None:
    for attempt in range(3):
      try:
        if isinstance(m.spec, EngineSpec):  # the actor process itself is gone: make a new one
          try:
            self._ray.kill(m.actor)
          except Exception:  # noqa: BLE001 -- it may be dead already
            pass
          m.actor = None
        await self._start_member(m)
        m.restarts += 1
        self.stats["member_restarts"] += 1
        logging.info("fleet member %d restarted", m.index)
        return
      except Exception as e:  # noqa: BLE001 -- retried, then left down
        logging.warning("restart of fleet member %d failed (%s); attempt %d", m.index, e, attempt)
        await asyncio.sleep(1.0)

  async def _health_loop(self) -> None:
    while True:
      await asyncio.sleep(self.health_interval_s)
      for m in self.members:
        if not m.healthy:
          continue
        why = None
        if m.client is not None:
          answered = await m.client.health(timeout_s=5)
          alive = True
          if isinstance(m.spec, ServerSpec):
            try:
              alive = (await asyncio.wait_for(m.actor.info.remote(), 10))["alive"]
            except Exception:  # noqa: BLE001 -- the actor itself is gone
              alive = False
          m.health_misses = 0 if answered else m.health_misses + 1
          if not alive:
            why = "server process exited"
          elif m.health_misses >= self.health_misses:
            why = f"no /health answer in {m.health_misses} checks in a row"
          elif not answered:
            self.stats["health_misses"] += 1
        else:
          try:
            await asyncio.wait_for(m.actor.pid.remote(), 10)
          except Exception:  # noqa: BLE001 -- any failure means down
            why = "engine actor unreachable"
        if why is not None:
          m.health_misses = 0
          self._mark_down(m, why)

  # --- generation ----------------------------------------------------------------

  def _least_loaded(self) -> _Member | None:
    """The healthy member with the least outstanding work (lowest index on ties)."""
    up = [m for m in self.members if m.healthy]
    return min(up, key=lambda m: (m.outstanding, m.index)) if up else None

  async def _pick(self) -> _Member:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
      m = self._least_loaded()
      if m is not None:
        return m
      if not any(m.restartable for m in self.members):
        raise FleetError("every fleet member is down and none can be restarted")
      await asyncio.sleep(0.1)
    raise FleetError("no healthy fleet member for 600 s")

  async def _send(self, m: _Member, r: GenerateRequest) -> list[Completion]:
    try:
      if m.client is not None:
        return await m.client.generate_one(r, timeout_s=self.request_timeout_s)
      return await m.actor.generate.remote([r])
    except SGLangRequestError:
      raise  # the request itself is bad: no member would take it
    except (SGLangError, OSError, asyncio.TimeoutError) as e:
      raise MemberDown(f"member {m.index}: {e}") from e
    except Exception as e:  # noqa: BLE001 -- Ray actor death surfaces as RayActorError
      if _is_ray_error(e):
        raise MemberDown(f"member {m.index}: {type(e).__name__}: {e}") from e
      raise

  def _assign(self, requests: Sequence[GenerateRequest]) -> list[_Member | None]:
    """Each request's first member under `batch_samples` routing (None: route it
    alone), its cost already counted in that member's outstanding work."""
    if self.batch_samples <= 0:
      return [None] * len(requests)
    out: list[_Member | None] = []
    m, room = None, 0
    for r in requests:
      if m is None or r.n > room:
        m = self._least_loaded()
        if m is None:
          return out + [None] * (len(requests) - len(out))
        room = max(self.batch_samples, r.n)
      m.outstanding += _cost(r)
      room -= r.n
      out.append(m)
    return out

  async def _dispatch(self, r: GenerateRequest, index: int, first: _Member | None = None,
                      started: set | None = None) -> list[Completion]:
    cost = _cost(r)
    if started is not None:
      started.add(index)
    for attempt in range(self.max_attempts):
      if attempt == 0 and first is not None and first.healthy:
        m = first                 # _assign counted the cost already
      else:
        if attempt == 0 and first is not None:  # went down since _assign
          first.outstanding -= cost
        m = await self._pick()
        m.outstanding += cost
      try:
        comps = await self._send(m, r)
      except MemberDown as e:
        self.stats["redispatched"] += 1
        self._mark_down(m, str(e))
        continue
      finally:
        m.outstanding -= cost
      if any(c.finish_reason == "abort" for c in comps):
        self.stats["requeued_aborted"] += 1
        continue
      m.served += 1
      rid = r.request_id or f"req-{index}"
      for c in comps:
        c.request_id = rid
        c.attempt = attempt + 1
      return comps
    raise FleetError(f"request {index} failed on {self.max_attempts} dispatches")

  async def agenerate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
    first, started = self._assign(requests), set()
    try:
      groups = await asyncio.gather(*(self._dispatch(r, i, m, started)
                                      for i, (r, m) in enumerate(zip(requests, first))))
    finally:  # a dispatch cancelled before it started never released its cost
      for i, (r, m) in enumerate(zip(requests, first)):
        if m is not None and i not in started:
          m.outstanding -= _cost(r)
    return [c for g in groups for c in g]

  def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
    """Samples every request (grouped by request, in order, samples in index order)."""
    return self._call(self.agenerate(list(requests)))

  # --- weights -------------------------------------------------------------------

  async def _update_member(self, m: _Member, path: str, version: int, abort: bool,
                           cont: bool = False) -> None:
    if isinstance(m.spec, UrlSpec) and m.spec.load_hf:
      path = path.rstrip("/") + ".hf"
    if m.client is not None:
      await m.client.update_weights_from_disk(path, weight_version=version,
                                              abort_all_requests=abort,
                                              continue_requests=cont)
    else:
      await m.actor.update_weights.remote(path, version)
    m.version = await self._member_version(m)
    if m.version != version:
      raise FleetError(f"member {m.index} reports weight version {m.version} after loading "
                       f"version {version}")

  async def _update_all(self, path: str, version: int, abort: bool,
                        cont: bool = False) -> dict[int, float]:
    async def one(m):
      t0 = time.perf_counter()
      await self._update_member(m, path, version, abort, cont)
      return time.perf_counter() - t0
    up = [m for m in self.members if m.healthy]
    secs = await asyncio.gather(*(one(m) for m in up), return_exceptions=True)
    errors = {m.index: s for m, s in zip(up, secs) if isinstance(s, BaseException)}
    if errors:
      raise FleetError("weight update refused: " + "; ".join(
          f"member {i}: {e}" for i, e in errors.items()))
    self.current = (path, version)
    return {m.index: s for m, s in zip(up, secs)}

  @property
  def weight_version(self) -> int:
    """The version every member acknowledged last (at start: the lowest a member
    reports)."""
    if self.current is not None:
      return self.current[1]
    versions = [m.version for m in self.members if m.version is not None]
    return min(versions) if versions else 0

  def update_weights(self, source: Any, version: int, *, abort_inflight: bool = False,
                     continue_inflight: bool = False) -> WeightUpdateStats:
    """Every healthy member loads `source` (the path of a published Orbax version) as
    `version` and acknowledges it.

    Returns WeightUpdateStats (seconds until the last member acknowledged, bytes on disk,
    `per_member` {member index: seconds}). Raises FleetError if a member refused (it
    keeps its previous weights; the fleet's version is unchanged), TypeError for a
    source that is not a path (members live in other processes: publish first).
    """
    if not isinstance(source, (str, os.PathLike)):
      raise TypeError(f"Fleet.update_weights takes the path of a published weights version "
                      f"(rlpt.train.publish.WeightPublisher), got {type(source).__name__}")
    path = os.path.abspath(os.fspath(source))
    t0 = time.perf_counter()
    acks = self._call(self._update_all(path, int(version), abort_inflight, continue_inflight))
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return WeightUpdateStats(version=int(version), seconds=time.perf_counter() - t0, bytes=size,
                             per_member=acks)

  def weight_versions(self) -> list[int | None]:
    """Each member's weight version, as it reports it now."""
    async def all_versions():
      return await asyncio.gather(*(self._member_version(m) for m in self.members))
    return self._call(all_versions())

  # --- introspection / shutdown -----------------------------------------------------

  def member_info(self) -> list[dict[str, Any]]:
    """url, pid, health, restarts and outstanding tokens of every member. A member
    whose actor cannot answer (its process or node died since the last health check)
    is reported with healthy False and the error, and marked down as a health check
    would (a restart follows where the member is restartable)."""
    async def info(m):
      d = {"index": m.index, "healthy": m.healthy, "restarts": m.restarts,
           "outstanding_tokens": m.outstanding, "served": m.served, "version": m.version}
      try:
        if isinstance(m.spec, ServerSpec) and m.actor is not None:
          d.update(await m.actor.info.remote())
        elif isinstance(m.spec, EngineSpec) and m.actor is not None and m.healthy:
          d["pid"] = await m.actor.pid.remote()
          d["node_id"] = await m.actor.node_id.remote()
        elif isinstance(m.spec, UrlSpec):
          d["url"] = m.spec.url
      except Exception as e:  # noqa: BLE001 -- Ray actor death surfaces as RayActorError
        if not _is_ray_error(e):
          raise
        d.update(healthy=False, error=f"{type(e).__name__}: {e}")
        if m.healthy:
          self._mark_down(m, f"member_info: {type(e).__name__}")
      return d
    async def all_info():
      return await asyncio.gather(*(info(m) for m in self.members))
    return self._call(all_info())

  def wait_healthy(self, timeout_s: float = 300.0) -> None:
    """Blocks until every member is healthy (e.g. after a restart)."""
    deadline = time.monotonic() + timeout_s
    while not all(m.healthy for m in self.members):
      if time.monotonic() > deadline:
        raise FleetError(f"members {[m.index for m in self.members if not m.healthy]} not "
                         f"healthy within {timeout_s} s")
      time.sleep(0.1)

  def shutdown(self) -> None:
    """Stops member processes and actors (and Ray, if this fleet started it)."""
    if self._health_task is not None:
      self._health_task.cancel()
    async def close():
      for m in self.members:
        if m.client is not None:
          await m.client.close()
        if m.restarting is not None:
          m.restarting.cancel()
    try:
      self._call(close(), timeout=30)
    except Exception:  # noqa: BLE001 -- best effort on the way out
      pass
    for m in self.members:
      if m.actor is not None:
        try:
          if isinstance(m.spec, ServerSpec):
            self._ray.get(m.actor.stop.remote(), timeout=30)
          self._ray.kill(m.actor)
        except Exception:  # noqa: BLE001
          pass
        m.actor = None
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(timeout=5)
    if self._own_ray:
      self._ray.shutdown()

  def __enter__(self) -> "Fleet":
    return self

  def __exit__(self, *exc) -> None:
    self.shutdown()
