"""Prompt building and rendering (fake and real tokenizers), and the task registry."""

from __future__ import annotations

import pytest

from kljax.tasks import (
    TASKS,
    build_messages,
    get_task,
    has_chat_template,
    parse_task_spec,
    render_messages,
    render_prompt,
    task_names,
)
from kljax.tasks.base import Example
from kljax.tasks.prompting import ANSWER_FORMATS, SYSTEM_PROMPT

EXAMPLE = Example("What is 2 + 3?", "5", "arithmetic", "test", "a")


class ChatTokenizer:
    """The duck-typed surface of a Hugging Face tokenizer with a chat template."""

    chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        self.calls.append((tokenize, add_generation_prompt))
        return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"


class PlainTokenizer:
    chat_template = None

    def apply_chat_template(self, messages, **kwargs):
        raise AssertionError("must not be called without a template")


def test_messages_ask_for_the_answer_format():
    task = get_task("countdown")
    messages = build_messages(EXAMPLE, task)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPT
    user = messages[1]["content"]
    assert user.startswith("What is 2 + 3?") and task.instruction in user and user.endswith(ANSWER_FORMATS["boxed"])
    line = build_messages(EXAMPLE, answer_format="answer_line", system_prompt=None)
    assert len(line) == 1 and line[0]["content"].endswith(ANSWER_FORMATS["answer_line"])
    with pytest.raises(ValueError, match=r"valid formats: \['answer_line', 'boxed'\]"):
        build_messages(EXAMPLE, answer_format="xml")


def test_render_with_a_chat_template():
    tokenizer = ChatTokenizer()
    assert has_chat_template(tokenizer)
    text = render_prompt(EXAMPLE, get_task("arithmetic"), tokenizer)
    assert text.startswith(f"<|system|>{SYSTEM_PROMPT}<|user|>What is 2 + 3?") and text.endswith("<|assistant|>")
    assert tokenizer.calls == [(False, True)]
    assert render_prompt(EXAMPLE, get_task("arithmetic"), tokenizer=tokenizer, chat_template=True) == text
    assert text.endswith(ANSWER_FORMATS["answer_line"] + "<|assistant|>")  # arithmetic asks for "Answer: N"


def test_render_without_a_chat_template():
    for tokenizer in (None, PlainTokenizer(), object()):
        assert not has_chat_template(tokenizer)
        text = render_prompt(EXAMPLE, tokenizer=tokenizer)
        assert text.startswith(SYSTEM_PROMPT + "\n\nUser: What is 2 + 3?") and text.endswith("\n\nAssistant:")
    assert render_messages(build_messages(EXAMPLE, system_prompt=None)).startswith("User: ")
    assert render_prompt(EXAMPLE, tokenizer=ChatTokenizer(), chat_template=False).endswith("Assistant:")
    with pytest.raises(ValueError, match=r"chat template was requested but the tokenizer \(PlainTokenizer\) has none"):
        render_prompt(EXAMPLE, tokenizer=PlainTokenizer(), chat_template=True)


def test_render_with_a_real_transformers_tokenizer():
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    assert not has_chat_template(tokenizer)
    with pytest.raises(ValueError, match="has none"):
        render_prompt(EXAMPLE, tokenizer=tokenizer, chat_template=True)
    tokenizer.chat_template = ChatTokenizer.chat_template
    text = render_prompt(EXAMPLE, tokenizer=tokenizer)
    assert text.startswith("<|system|>") and "<|user|>What is 2 + 3?" in text and text.endswith("<|assistant|>")


def test_registry_names_and_errors():
    assert task_names() == sorted(TASKS)
    assert {"arithmetic", "countdown", "math", "math500", "gsm8k", "mmlu_college_physics"} <= set(task_names())
    with pytest.raises(ValueError, match=r"unknown task 'arithmetics'; valid tasks: \['arithmetic', 'countdown'"):
        get_task("arithmetics")
    task, split = parse_task_spec("arithmetic:ood_ops")
    assert task.name == "arithmetic" and split == "ood_ops"
    assert parse_task_spec("countdown")[1] is None
    with pytest.raises(ValueError, match=r"valid splits: \['train', 'test', 'ood_numbers'\]"):
        parse_task_spec("countdown:ood_ops")
    # loaded tasks read nothing until asked for examples
    assert get_task("gsm8k", data_dir="/nonexistent").splits == ("train", "test")
    assert get_task("mmlu_college_biology").name == "mmlu_college_biology"
    assert get_task("math", data_dir="/nonexistent").uses_verifier_pool
