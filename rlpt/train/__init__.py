"""Training: the config read once (settings), the build step, the RL step's three stages
(collector, learner, weight sync), the RL loop, SFT, checkpointing, workdir, metrics."""
