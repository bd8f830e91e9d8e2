"""The tool-call format: parsing model text, errors the model reads, result messages."""

import pytest

from rlpt.envs import tool_calls as tc
from rlpt.models.gguf_file import GGUFFile
from rlpt.models.loading import resolve_path
from rlpt.models.tokenizer import Tokenizer

TOOLS = ("python", "run")


@pytest.fixture(scope="module")
def smollm2_tokenizer():
  path = resolve_path("smollm2-135m-instruct")
  return Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, source=path)


def test_calls_are_read_in_order_with_prose_around_them():
  text = ("Let me compute.\n" + tc.format_call("python", {"code": "print(6 * 7)"}) +
          "\nand then\n<tool_call>{\"name\": \"run\", \"arguments\": \"{\\\"command\\\": \\\"ls\\\"}\"}"
          "</tool_call> done")
  calls = tc.parse(text, TOOLS)
  assert calls == [tc.ToolCall("python", {"code": "print(6 * 7)"}),
                   tc.ToolCall("run", {"command": "ls"})]  # string-encoded arguments accepted
  assert tc.parse("no calls here", TOOLS) == []
  assert tc.parse(tc.format_call("run", {}), TOOLS) == [tc.ToolCall("run", {})]


@pytest.mark.parametrize("body,needle", [
    ("{\"name\": \"python\", \"arguments\": {\"code\": \"1\"", "not valid JSON"),
    ("[1, 2]", "JSON object with a string \"name\""),
    ("{\"arguments\": {}}", "string \"name\""),
    ("{\"name\": \"python\", \"arguments\": [1]}", "must be a JSON object, got list"),
    ("{\"name\": \"rm_rf\", \"arguments\": {}}", "unknown tool 'rm_rf'; the tools are python, run"),
])
def test_malformed_calls_become_errors_for_the_model(body, needle):
  (err,) = tc.parse(f"x <tool_call>{body}</tool_call> y", TOOLS)
  assert isinstance(err, tc.ToolCallError) and needle in err.message, err
  assert err.raw.startswith(tc.OPEN)


def test_an_unterminated_call_is_an_error_not_a_hang():
  (err,) = tc.parse("<tool_call>{\"name\": \"python\", \"arguments\": {}}", TOOLS)
  assert isinstance(err, tc.ToolCallError) and "without </tool_call>" in err.message


def test_results_enter_as_tool_turns_or_the_documented_fallback():
  assert tc.result_message("python", "42", tool_role=True) == {
      "role": "tool", "name": "python", "content": "42"}
  assert tc.result_message("python", "42", tool_role=False) == {
      "role": "user", "content": "<tool_response>\n42\n</tool_response>"}


def test_smollm2_template_has_no_tool_role_and_a_qwen_style_one_does(smollm2_tokenizer):
  assert not tc.template_has_tool_role(smollm2_tokenizer.chat_template)
  qwen_like = ("{% for m in messages %}{% if m.role == 'tool' %}<tool_response>{{ m.content }}"
               "</tool_response>{% else %}{{ m.content }}{% endif %}{% endfor %}")
  assert tc.template_has_tool_role(qwen_like)
  assert not tc.template_has_tool_role(None)
