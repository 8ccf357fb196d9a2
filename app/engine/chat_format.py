"""Chat formats: a message list → token ids, built segment by segment.

Each message is tokenised on its own and the ids are concatenated, so a conversation can
grow by appending ids (the agent never re-tokenises its history). The formats reproduce
the models' own chat templates (ChatML for SmolLM2 / Qwen, the Llama 3 header format).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str


class ChatFormat:
    """Renders messages for one model. `render(m)` is one message's text, complete."""

    name = "generic"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def render(self, m: Message) -> str:
        raise NotImplementedError

    def assistant_prefix(self) -> str:
        raise NotImplementedError

    def end_of_turn(self) -> str:
        """What closes a message (the model's stop token when it ends a reply itself)."""
        raise NotImplementedError

    def after_turn(self) -> str:
        """Text between a closed message and the next one."""
        return ""

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def message_ids(self, m: Message) -> list[int]:
        return self.encode(self.render(m))

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The ids of `messages` followed by the assistant's header (the generation point)."""
        ids: list[int] = []
        for m in messages:
            ids += self.message_ids(m)
        return ids + self.encode(self.assistant_prefix())


class ChatML(ChatFormat):
    """<|im_start|>role\\ncontent<|im_end|>\\n (SmolLM2, Qwen2.5)."""

    name = "chatml"

    def render(self, m: Message) -> str:
        return f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n"

    def assistant_prefix(self) -> str:
        return "<|im_start|>assistant\n"

    def end_of_turn(self) -> str:
        return "<|im_end|>"

    def after_turn(self) -> str:
        return "\n"


class Llama3(ChatFormat):
    """<|start_header_id|>role<|end_header_id|>\\n\\ncontent<|eot_id|> after <|begin_of_text|>."""

    name = "llama3"

    def render(self, m: Message) -> str:
        role = "ipython" if m.role == "tool" else m.role
        return f"<|start_header_id|>{role}<|end_header_id|>\n\n{m.content}<|eot_id|>"

    def assistant_prefix(self) -> str:
        return "<|start_header_id|>assistant<|end_header_id|>\n\n"

    def end_of_turn(self) -> str:
        return "<|eot_id|>"

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        return self.encode("<|begin_of_text|>") + super().prompt_ids(messages)


FORMATS = {"chatml": ChatML, "llama3": Llama3}


def chat_format_for(name: str, tokenizer) -> ChatFormat:
    if name not in FORMATS:
        raise ValueError(f"chat format {name!r} is not supported ({', '.join(FORMATS)})")
    return FORMATS[name](tokenizer)
