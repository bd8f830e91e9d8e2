"""Training: workdir conventions, metrics, progress, SFT, the RL loop, checkpointing."""
