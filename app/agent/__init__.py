"""The agent: canonical prompt (token ids, append-only), toolkit, constrained tool calls,
the loop (a generator of app.events), and the prefix-break detector.

Imports app.engine and app.events only; never app.store, app.tui or textual.
"""

from app.agent.cachecheck import PrefixDetector, lint_prompt
from app.agent.loop import Agent, AgentLimits
from app.agent.prompt import SYSTEM_PROMPT, CanonicalPrompt
from app.agent.toolkit import Tool, Toolkit, ToolResult, load_tools_dir, tool_from_function

__all__ = [
    "SYSTEM_PROMPT",
    "Agent",
    "AgentLimits",
    "CanonicalPrompt",
    "PrefixDetector",
    "Tool",
    "ToolResult",
    "Toolkit",
    "lint_prompt",
    "load_tools_dir",
    "tool_from_function",
]
