"""Multi-turn episodes: environments that answer a model's turns with tool results.

base            Environment (reset / step / completion / close), EnvStep, ToolRecord
episode         token-exact episodes driven through any RolloutEngine (run_episodes),
                their caps, the chat-template rendering of environment turns
tool_calls      the tool-call format in model text and tool results as messages
sandbox_tools   write_file / read_file / edit_file / run / python over one SandboxSession
python_tool     an environment: a task answered with a Python tool at hand
code_repair     an environment: fix a planted bug in solution.py (edit, run the tests,
                read the failure, fix); hidden tests score the final file
registry        which domains are episodic, and by which environment
"""
