"""One module per benchmark: `launch/benches/<name>.py` defines

    def run(args: list[str]) -> list[benches.common.Row]

and `python -m launch.bench <name>` finds it by name. Benchmarks may import
reference stacks (torch, transformers) as baselines; rlpt itself never does.
"""
