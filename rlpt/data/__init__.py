"""Data: task sources per domain (rlpt.data.sources), the domain mixer (mixer), the
trajectory store (trajectories), and the synthetic verifiable task (synthetic)."""
