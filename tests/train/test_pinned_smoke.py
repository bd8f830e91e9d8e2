"""configs/smoke.py pinned step for step: the RL step's refactors must not change what it
computes. The figures were recorded on commit 7d9a30c (before the RL step became three
stages) and hold on any later commit that leaves the step's arithmetic alone.

Rewards are exact (counts of correct digits over 128 samples: any change in what was
sampled shows); losses are compared to 1e-4 relative (XLA:CPU may fuse reductions
differently on another processor, which moves the last bits of a float32 loss).
"""

import numpy as np
import pytest

from configs import smoke
from rlpt.train import rl_loop
from rlpt.train.metrics import read_metrics

# (step, loss, reward_mean, dropped_groups)
PINNED = {
    None: [
        (1, -0.009305691346526146, 0.04296875, 0),
        (2, -0.01397701259702444, 0.072265625, 0),
        (3, -0.017143821343779564, 0.080078125, 0),
        (4, -0.0141177112236619, 0.0703125, 0),
        (5, -0.02057550847530365, 0.0859375, 0),
        (6, -0.008588247001171112, 0.1015625, 0),
    ],
    # DAPO's preset fields: dynamic sampling drops and refills groups every step.
    "dapo": [
        (1, -0.018157491460442543, 0.05965909090909091, 17),
        (2, -0.022356241941452026, 0.0675, 9),
        (3, -0.0013864506036043167, 0.08482142857142858, 5),
        (4, -0.01060025580227375, 0.07472826086956522, 8),
    ],
}


@pytest.mark.parametrize("preset", list(PINNED))
def test_smoke_losses_and_rewards_are_pinned(preset, tmp_path):
  want = PINNED[preset]
  c = smoke.get_config(preset)
  c.total_steps = len(want)
  c.checkpoint.every = 100
  c.eval.every = 0
  rl_loop.train(c, str(tmp_path))
  rows = [x for x in read_metrics(str(tmp_path)) if x["step"] > 0]
  assert [x["step"] for x in rows] == [w[0] for w in want]
  np.testing.assert_array_equal([x["reward_mean"] for x in rows], [w[2] for w in want])
  np.testing.assert_array_equal([x["dropped_groups"] for x in rows], [w[3] for w in want])
  np.testing.assert_allclose([x["loss"] for x in rows], [w[1] for w in want], rtol=1e-4,
                             atol=1e-7)
