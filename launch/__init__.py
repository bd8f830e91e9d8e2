"""absl entry points: `python -m launch.<name> --config=configs/NAME.py[:ARG] ...`."""
