"""`rollout.engine = "fleet"`: the synchronous loop on configs/smoke.py with two rollout
server processes as Ray actors, every weight sync an Orbax version published to
WORKDIR/weights and loaded by both members; the holdout decoded in the learner's
process (eval.engine = "learner")."""

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from configs import smoke
from rlpt.train import rl_loop
from rlpt.train.metrics import read_metrics
from rlpt.train.publish import published_versions
from tests.train.test_pinned_smoke import PINNED

STEPS = 3
HOLDOUT = 24


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  from rlpt.rollout.fleet import Fleet
  wd = tmp_path_factory.mktemp("fleet_run")
  c = smoke.get_config()
  c.total_steps = STEPS
  c.checkpoint.every = 100
  c.eval.every = 0
  c.eval.engine = "learner"
  c.data.holdout_per_domain = HOLDOUT
  c.rollout.engine = "fleet"
  c.fleet.members = 2
  temperatures = []   # of every request the fleet was sent
  generate = Fleet.generate

  def recording(self, requests):
    temperatures.extend(r.sampling.temperature for r in requests)
    return generate(self, requests)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(Fleet, "generate", recording)
    res = rl_loop.train(c, str(wd))
  return wd, res, temperatures


def test_fleet_run_trains_through_published_versions(run):
  wd, res, _ = run
  rows = [x for x in read_metrics(str(wd)) if x["step"] > 0]
  assert [x["step"] for x in rows] == list(range(1, STEPS + 1))
  for x in rows:
    assert np.isfinite(x["loss"]) and x["time/sync_s"] > 0
    assert x["staleness"] == 0 and x["staleness_max"] == 0
    # the servers score the sampled tokens with the weights the learner had
    assert x["logprob_gap_max"] < 1e-4, x["logprob_gap_max"]
  # every step's rollouts came from the version published after the previous step
  for step in range(1, STEPS + 1):
    t = pq.read_table(os.path.join(wd, "trajectories", f"step_{step:08d}.parquet"),
                      columns=["weight_version"])
    assert set(t.column("weight_version").to_pylist()) == {step - 1}
  weights = os.path.join(wd, "weights")
  assert published_versions(weights) == [STEPS - 1, STEPS]  # keep=2, older ones collected
  assert os.path.isfile(os.path.join(weights, "base.hf", "config.json"))
  logs = os.listdir(os.path.join(wd, "fleet_logs"))
  assert len([f for f in logs if f.startswith("serve-")]) == 2, logs


def test_fleet_run_matches_the_embedded_engine(run):
  """Sampling is a function of (weights, per-prompt seed), so the same steps through
  two server members give the pinned embedded-engine figures."""
  wd, _, _ = run
  rows = [x for x in read_metrics(str(wd)) if x["step"] > 0]
  want = PINNED[None][:STEPS]
  np.testing.assert_array_equal([x["reward_mean"] for x in rows], [w[2] for w in want])
  np.testing.assert_allclose([x["loss"] for x in rows], [w[1] for w in want], rtol=1e-4,
                             atol=1e-7)
  cfg = json.load(open(os.path.join(wd, "config.json")))
  assert cfg["rollout"]["engine"] == "fleet"


def test_the_holdout_is_decoded_in_the_learners_process_not_by_the_fleet(run):
  """eval.engine = "learner": the holdout after SFT and after the last step was decoded
  (every task scored), and no greedy (holdout) request reached the fleet. That engine
  decodes the parameters it is handed: test_evaluation.py."""
  _, res, temperatures = run
  assert temperatures and 0.0 not in temperatures, sorted(set(temperatures))
  assert sorted(res.evals) == [0, STEPS]
  for step in (0, STEPS):
    assert res.evals[step]["synthetic"]["n"] == HOLDOUT, res.evals[step]


def _free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["url", "server"])
def test_a_member_that_cannot_start_fails_the_run_before_step_1(tmp_path, kind):
  """An unreachable `fleet.kind = "url"` server, and a server member that is not healthy
  within fleet.startup_timeout_s: the run stops before step 1 with a FleetError naming
  the member and the cause."""
  from rlpt.rollout.fleet import FleetError
  c = smoke.get_config()
  c.total_steps = 2
  c.eval.every = 0
  c.rollout.engine = "fleet"
  c.fleet.kind = kind
  c.fleet.members = 1
  c.fleet.startup_timeout_s = 1.0
  port = _free_port()
  c.fleet.urls = f"http://127.0.0.1:{port}" if kind == "url" else ""
  want = (rf"fleet member 0 \(http://127.0.0.1:{port}\) did not start: SGLangUnavailable: .*"
          rf"not healthy within 1.0 s" if kind == "url" else
          r"fleet member 0 \(ServerSpec\) did not start: .*(not healthy|exited)")
  with pytest.raises(FleetError, match=want):
    rl_loop.train(c, str(tmp_path))
  assert not os.path.exists(tmp_path / "metrics.jsonl") or read_metrics(str(tmp_path)) == []
