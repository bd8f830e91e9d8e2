"""Multi-turn episodes: environments that answer a model's turns with tool results.

tool_calls      the tool-call format in model text and tool results as messages
sandbox_tools   write_file / read_file / run / python over one SandboxSession
"""
