"""A real 2-member Ray fleet on 127.0.0.1: each member a Ray actor owning a real
rollout server process (`python -m rlpt.rollout.server_main`, what launch.serve runs;
tiny random model in an HF directory, SmolLM2's tokenizer). Generate through the fleet, publish v1 from an Orbax checkpoint, see
every member report it; SIGKILL a member's server mid-batch: every request
completes exactly once and the member comes back."""

import os
import signal
import threading
import time

import pytest

from rlpt.rollout import Fleet, GenerateRequest, SamplingParams
from rlpt.rollout.fleet import ServerSpec
from rlpt.rollout.server_main import ServeSettings
from rlpt.train.publish import WeightPublisher, published_versions
from configs import smoke
from rlpt.train import settings as settings_lib
from tests.rollout import serving


@pytest.fixture(scope="module")
def tok():
  return serving.smollm2_tokenizer()


@pytest.fixture(scope="module")
def fleet(tok, tmp_path_factory):
  root = tmp_path_factory.mktemp("fleet")
  model_dir = serving.save_tiny_hf(str(root / "tiny"), tok)
  spec = ServerSpec(ServeSettings(model=model_dir, engine=serving.TINY_ENGINE, warmup=False),
                    env=tuple(serving.compile_cache_env().items()), log_dir=str(root),
                    startup_timeout_s=600)
  f = Fleet([spec, spec], num_cpus=2, health_interval_s=0.5, client_retries=1)
  yield f
  f.shutdown()


@pytest.fixture(scope="module")
def publisher(tmp_path_factory):
  return WeightPublisher(str(tmp_path_factory.mktemp("workdir") / "weights"), keep=1)


def _requests(tok, k, max_new=16, temperature=0.0, n=1, tag="r"):
  return [GenerateRequest(prompt_ids=tuple(tok.encode(f"item {i}: the")), n=n,
                          sampling=SamplingParams(max_new_tokens=max_new, temperature=temperature,
                                                  ignore_eos=True, seed=i),
                          request_id=f"{tag}{i}") for i in range(k)]


def test_generate_routes_over_both_members(fleet, tok):
  reqs = _requests(tok, 8, n=2, temperature=1.0)
  comps = fleet.generate(reqs)
  assert len(comps) == 16
  assert [(c.request_id, c.sample_index) for c in comps] == [
      (f"r{i}", j) for i in range(8) for j in range(2)]
  assert all(len(c.token_ids) == 16 and c.weight_version == 0 for c in comps)
  served = [m["served"] for m in fleet.member_info()]
  assert sum(served) == 8 and min(served) >= 1, served  # load spread by outstanding tokens
  assert fleet.weight_versions() == [0, 0]


def test_batch_routing_keeps_a_round_on_one_member(fleet, tok):
  """With batch_samples a call's requests go to members in runs of that many samples:
  a 4 x 2 round stays on one member (the other is idle), an 8 x 2 call is two runs, one
  on each; every request still comes back once, in order, and no cost stays counted."""
  fleet.batch_samples = 8
  try:
    def served():
      return [m["served"] for m in fleet.member_info()]
    s0 = served()
    comps = fleet.generate(_requests(tok, 4, n=2, temperature=1.0, tag="b"))
    assert [(c.request_id, c.sample_index) for c in comps] == [
        (f"b{i}", j) for i in range(4) for j in range(2)]
    s1 = served()
    assert sorted(b - a for a, b in zip(s0, s1)) == [0, 4], (s0, s1)
    fleet.generate(_requests(tok, 8, n=2, temperature=1.0, tag="c"))
    assert [b - a for a, b in zip(s1, served())] == [4, 4]
    assert [m.outstanding for m in fleet.members] == [0, 0]
  finally:
    fleet.batch_samples = 0


def test_publish_v1_every_member_acknowledges(fleet, tok, publisher):
  from rlpt.models import load_model
  model, _ = load_model(_model_dir(fleet))  # the weights the servers start from
  before = fleet.generate(_requests(tok, 4))
  info = publisher.publish(serving.perturbed(model.arrays()), 1)
  stats = fleet.update_weights(info.path, 1)
  assert sorted(stats.per_member) == [0, 1] and stats.version == 1 and stats.bytes > 0
  assert fleet.weight_versions() == [1, 1] and fleet.weight_version == 1
  after = fleet.generate(_requests(tok, 4))
  assert all(c.weight_version == 1 for c in after)
  assert [c.token_ids for c in after] != [c.token_ids for c in before]
  # a second version; v1 is garbage-collected once nobody serves it
  info2 = publisher.publish(serving.perturbed(model.arrays(), seed=2), 2)
  fleet.update_weights(info2.path, 2)
  assert publisher.gc(in_use=fleet.weight_versions()) == [1]
  assert published_versions(publisher.root) == [2]
  # a refused version leaves every member on v2
  from rlpt.rollout.fleet import FleetError
  with pytest.raises(FleetError, match="refused"):
    fleet.update_weights(os.path.join(publisher.root, "v9"), 9)
  assert fleet.weight_versions() == [2, 2]


def test_weights_arrive_as_a_published_path(fleet):
  with pytest.raises(TypeError, match="path of a published weights version"):
    fleet.update_weights({"embed": None}, 5)


def _model_dir(fleet):
  return fleet.members[0].spec.settings.model


def test_sigkill_member_mid_batch(fleet, tok):
  old = fleet.member_info()
  victim = old[0]
  reqs = _requests(tok, 12, max_new=48, tag="k")
  out = {}

  def run():
    out["comps"] = fleet.generate(reqs)

  t = threading.Thread(target=run)
  t.start()
  deadline = time.monotonic() + 120
  while fleet.members[0].outstanding == 0 or fleet.members[1].outstanding == 0:
    assert time.monotonic() < deadline, "requests never reached both members"
    time.sleep(0.01)
  os.kill(victim["pid"], signal.SIGKILL)
  t.join(600)
  comps = out["comps"]
  ids = [c.request_id for c in comps]
  assert sorted(ids) == sorted(f"k{i}" for i in range(12)) and len(set(ids)) == 12
  assert all(c.finish_reason == "length" and len(c.token_ids) == 48 for c in comps)
  assert fleet.stats["member_failures"] >= 1 and fleet.stats["redispatched"] >= 1
  # the re-dispatched requests say so (the trajectory store's attempt column)
  assert min(c.attempt for c in comps) == 1 and max(c.attempt for c in comps) >= 2
  fleet.wait_healthy(timeout_s=300)
  now = fleet.member_info()[0]
  assert now["alive"] and now["pid"] != victim["pid"] and now["starts"] == victim["starts"] + 1
  assert now["version"] == fleet.weight_versions()[1]  # caught up with the fleet's weights
  again = fleet.generate(_requests(tok, 6, tag="z"))
  assert len(again) == 6 and min(m["served"] for m in fleet.member_info()) >= 1


def test_a_member_slow_to_answer_health_stays_up_a_hung_one_goes_down(fleet, tok):
  """SIGSTOP a member's server (alive, answering nothing): one missed /health check
  (5 s) is a busy server, not a failure; `health_misses` (3) in a row is a hung one,
  declared down and restarted when it answers again."""
  fleet.wait_healthy(timeout_s=300)
  pid = fleet.member_info()[1]["pid"]
  failures, misses = fleet.stats["member_failures"], fleet.stats["health_misses"]
  os.kill(pid, signal.SIGSTOP)
  try:
    time.sleep(9.0)   # one check (5 s) surely times out inside the stop, fewer than 3 in a row
  finally:
    os.kill(pid, signal.SIGCONT)
  time.sleep(1.5)
  assert fleet.stats["health_misses"] > misses
  assert fleet.stats["member_failures"] == failures and fleet.members[1].healthy
  os.kill(pid, signal.SIGSTOP)
  try:
    deadline = time.monotonic() + 60
    while fleet.members[1].healthy:
      assert time.monotonic() < deadline, "a hung member was never declared down"
      time.sleep(0.2)
  finally:
    os.kill(pid, signal.SIGCONT)
  assert fleet.stats["member_failures"] == failures + 1
  fleet.wait_healthy(timeout_s=300)
  assert len(fleet.generate(_requests(tok, 4, tag="h"))) == 4


def _generate_across_an_update(fleet, tok, publisher, tag, **update):
  """Publishes a perturbed next version and has the fleet load it (`update`: the
  in-flight policy) 0.5 s into a generation of 8 requests; (version, completions).
  448 tokens (the servers' max_len is 512), so the requests are still decoding when
  the update lands: with 64 tokens a warm tiny model sometimes finished all eight
  first (seen once in a clean clone on a quiet machine; a call takes ≈3.4 s)."""
  from rlpt.models import load_model
  model, _ = load_model(_model_dir(fleet))
  v = max(published_versions(publisher.root)) + 1
  info = publisher.publish(serving.perturbed(model.arrays(), seed=v), v)
  reqs = _requests(tok, 8, max_new=448, tag=tag)
  out = {}
  t = threading.Thread(target=lambda: out.setdefault("comps", fleet.generate(reqs)))
  t.start()
  while sum(m.outstanding for m in fleet.members) == 0:
    time.sleep(0.01)
  time.sleep(0.5)
  fleet.update_weights(info.path, v, **update)
  t.join(600)
  return v, out["comps"]


def test_update_with_abort_requeues_inflight(fleet, tok, publisher):
  v, comps = _generate_across_an_update(fleet, tok, publisher, "a", abort_inflight=True)
  assert len(comps) == 8 and all(c.weight_version == v for c in comps)
  assert all(c.finish_reason == "length" for c in comps)
  assert fleet.stats["requeued_aborted"] >= 1


def test_update_with_continue_makes_partial_rollouts(fleet, tok, publisher):
  """continue_inflight: the members load the new version beside their running batch and
  its requests go on under it: each of them starts on the old version and its later
  tokens are the new version's (output_token_weight_versions through the HTTP API);
  nothing is re-queued, and every token is accounted for."""
  old, requeued = fleet.weight_version, fleet.stats["requeued_aborted"]
  v, comps = _generate_across_an_update(fleet, tok, publisher, "p", continue_inflight=True)
  assert len(comps) == 8 and all(c.finish_reason == "length" for c in comps)
  assert fleet.stats["requeued_aborted"] == requeued
  partial = 0
  for c in comps:
    tv = c.token_versions
    if tv is None:
      # a request queued behind a running batch starts after the load; one that its
      # member finished before the load was in (a slow load on a busy machine: seen in
      # a clean-clone `make test`) is all the old version's
      assert c.weight_version in (old, v), (c.weight_version, old, v)
      continue
    partial += 1
    assert c.weight_version == old and len(tv) == len(c.token_ids) == 448
    k = tv.index(v)  # one switch, old -> new, after the first token
    assert 0 < k and tv == [old] * k + [v] * (448 - k)
  assert partial >= 1
  assert fleet.weight_version == v == fleet.weight_versions()[0] == fleet.weight_versions()[1]


def test_in_process_engine_member(fleet, tok, publisher):
  """A member that is a JaxEngine inside its Ray actor (no HTTP): same routing and
  weight acknowledgement; concurrent requests share one engine batch."""
  from rlpt.models import load_model
  from rlpt.rollout.fleet import EngineSpec
  engine_kw = tuple((k, getattr(serving.TINY_ENGINE, k)) for k in
                    ("max_batch", "max_len", "kv_cache_mib", "min_prompt_bucket",
                     "length_multiple"))
  ef = Fleet([EngineSpec(model=_model_dir(fleet), engine=engine_kw)], health_interval_s=0)
  try:
    reqs = _requests(tok, 4, n=2, temperature=1.0, tag="e")
    comps = ef.generate(reqs)
    assert [(c.request_id, c.sample_index) for c in comps] == [
        (f"e{i}", j) for i in range(4) for j in range(2)]
    assert ef.weight_versions() == [0]
    # the same request through an HTTP member gives the same tokens (same weights, seed)
    model, _ = load_model(_model_dir(fleet))
    v = max(published_versions(publisher.root)) + 1
    info = publisher.publish(model.arrays(), v)
    fleet.update_weights(info.path, v)
    ef.update_weights(info.path, v)
    assert ef.weight_versions() == [v]
    a, b = ef.generate(reqs[:2]), fleet.generate(reqs[:2])
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(c.weight_version == v for c in a + b)
    # the actor dies between health checks (this fleet runs none): member_info reports
    # it down, with the error, instead of raising Ray's (a lost node did that once)
    import ray
    actor, failures = ef.members[0].actor, ef.stats["member_failures"]
    ray.kill(actor)
    with pytest.raises(ray.exceptions.RayActorError):
      ray.get(actor.pid.remote(), timeout=60)
    info = ef.member_info()[0]
    assert info["healthy"] is False and "Actor" in info["error"], info
    assert ef.stats["member_failures"] == failures + 1
  finally:
    ef.shutdown()


def test_url_members_from_fleet_settings(fleet, tok):
  """`fleet.kind = "url"`: members that already run (as real SGLang servers would)."""
  from rlpt.train import fleet_engine
  cfg = smoke.get_config()
  cfg.fleet.kind, cfg.fleet.load_hf = "url", False
  cfg.fleet.urls = ",".join(m["url"] for m in fleet.member_info())
  specs = fleet_engine.member_specs(settings_lib.Settings.from_config(cfg), base_model="")
  assert [type(x).__name__ for x in specs] == ["UrlSpec", "UrlSpec"]
  uf = Fleet(specs, health_interval_s=0)
  try:
    assert uf.weight_versions() == fleet.weight_versions()
    comps = uf.generate(_requests(tok, 4, tag="u"))
    assert [c.request_id for c in comps] == [f"u{i}" for i in range(4)]
    assert [c.token_ids for c in comps] == [c.token_ids for c in fleet.generate(_requests(tok, 4))]
  finally:
    uf.shutdown()


def test_server_members_batch_one_rounds_samples():
  """A server member's batch is capped at one RL round's samples (prompts_per_step x
  n), so the holdout's n=1 prompts go prompts_per_step x n to a batch."""
  from rlpt.train import fleet_engine
  cfg = smoke.get_config()
  cfg.rollout.engine, cfg.fleet.kind = "fleet", "server"
  s = settings_lib.Settings.from_config(cfg)
  (spec, *_) = fleet_engine.member_specs(s, base_model="m")
  samples = s.data.prompts_per_step * s.rollout.n
  assert spec.settings.max_batch_samples == samples == spec.settings.max_batch_prompts


def test_server_members_share_a_compilation_cache(monkeypatch):
  """Members compile into one persistent cache: the caller's, else the run's."""
  from rlpt.train import fleet_engine
  cfg = smoke.get_config()
  cfg.rollout.engine, cfg.fleet.kind, cfg.fleet.members = "fleet", "server", 2
  s = settings_lib.Settings.from_config(cfg)
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
  assert "JAX_COMPILATION_CACHE_DIR" not in dict(fleet_engine.member_specs(s, "m")[0].env)
  envs = [dict(m.env) for m in fleet_engine.member_specs(s, "m", compile_cache="/w/jax_cache")]
  assert [e["JAX_COMPILATION_CACHE_DIR"] for e in envs] == ["/w/jax_cache"] * 2
  assert envs[0]["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "1"
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/mine")
  env = dict(fleet_engine.member_specs(s, "m", compile_cache="/w/jax_cache")[0].env)
  assert env["JAX_COMPILATION_CACHE_DIR"] == "/mine" and env["XLA_FLAGS"] == ""
