"""Data: task sources per domain (rlpt.data.sources), the domain mixer, the trajectory store."""
