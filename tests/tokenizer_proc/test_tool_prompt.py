"""Tools and tool-call turns in the prompt, for templates that render tools and for those
that do not (the default model's)."""

from __future__ import annotations

import json

from tessera.formats.chat_template import render_chat
from tessera.tokenizer_proc.tool_prompt import template_inputs

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
                                          "properties": {"city": {"type": "string"}}}}}]
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WITH_TOOLS = ("{% if tools %}TOOLS={{ tools | tojson }}\n{% endif %}{% for m in messages %}"
              "{{ m.role }}: {{ m.content }}{% for c in m.tool_calls or [] %}"
              "CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}\n"
              "{% endfor %}")
HISTORY = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "12 C, rain"},
]


def _render(template: str, tools: list | None) -> str:
    messages, extra = template_inputs(HISTORY, tools, template)
    return render_chat(template, messages, add_generation_prompt=True, special_tokens={},
                       **extra)


def test_a_template_without_tools_gets_hermes_turns_and_a_tool_system_prompt() -> None:
    text = _render(CHATML, TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(TOOLS[0]) in text  # the function described, whole
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Oslo"}}\n</tool_call><|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\n12 C, rain\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_history_round_trips_without_tools_too() -> None:
    text = _render(CHATML, None)
    assert "# Tools" not in text and "<tool_call>" in text and "<tool_response>" in text


def test_a_template_with_tools_renders_them_itself() -> None:
    text = _render(WITH_TOOLS, TOOLS)
    assert text.startswith("TOOLS=" + json.dumps(TOOLS))
    # arguments arrive as an object, so tojson writes them once, not as a quoted string
    assert 'CALL get_weather {"city": "Oslo"}' in text
    assert "tool: 12 C, rain" in text


def test_plain_conversations_are_left_alone() -> None:
    plain = [{"role": "user", "content": "hi"}]
    assert template_inputs(plain, None, CHATML) == (plain, {})
