"""Experiment configs: each file defines get_config(arg=None) -> ml_collections.ConfigDict."""
