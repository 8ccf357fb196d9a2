"""kvdeck: an operations console for an on-device LLM agent."""

__version__ = "0.1.0"
