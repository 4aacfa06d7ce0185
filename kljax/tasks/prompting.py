"""Prompts: chat messages for an example, rendered with a tokenizer's chat template or as plain text.

    messages = build_messages(example, task)          # [{"role": "system", ...}, {"role": "user", ...}]
    text = render_messages(messages, tokenizer)       # the chat template when the tokenizer has one

The user message is the example's prompt, then the task's own instruction (if any), then the answer
format: "boxed" asks for the final answer in \\boxed{}, "answer_line" for a last line "Answer: ...".
Both are what `answers.extract_final_answer` reads first.

Tokenizers are duck-typed: anything with `apply_chat_template(messages, tokenize=False,
add_generation_prompt=True)` and a non-empty `chat_template` attribute counts as having a chat
template (Hugging Face tokenizers do; tests pass a tiny fake). Without one, `PLAIN_TEMPLATE` is used,
unless the template was asked for explicitly (`chat_template=True`), which is then an error.
"""

from __future__ import annotations

from typing import Any

from kljax.tasks.base import Example, Task

SYSTEM_PROMPT = "You are a helpful assistant. Reason step by step, then state the final answer."
ANSWER_FORMATS = {
    "boxed": "Put your final answer within \\boxed{}.",
    "answer_line": 'End your response with a line of the form "Answer: <your final answer>".',
}
PLAIN_TEMPLATE = "{system}\n\nUser: {user}\n\nAssistant:"

Message = dict[str, str]


def build_messages(
    example: Example,
    task: Task | None = None,
    *,
    answer_format: str | None = None,
    system_prompt: str | None = SYSTEM_PROMPT,
) -> list[Message]:
    """System and user messages for `example` (the system message is left out when system_prompt is None).

    `answer_format` defaults to the task's (`task.answer_format`, else "boxed"); the task's
    `instruction` goes between the prompt and the answer-format line.
    """
    answer_format = answer_format or (task.answer_format if task is not None else "boxed")
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"unknown answer format {answer_format!r}; valid formats: {sorted(ANSWER_FORMATS)}")
    parts = [example.prompt.strip()]
    if task is not None and task.instruction:
        parts.append(task.instruction)
    parts.append(ANSWER_FORMATS[answer_format])
    messages: list[Message] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": "\n\n".join(parts)})
    return messages


def has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` has a usable chat template (duck-typed; see the module docstring)."""
    return (
        tokenizer is not None
        and callable(getattr(tokenizer, "apply_chat_template", None))
        and bool(getattr(tokenizer, "chat_template", None))
    )


def render_messages(messages: list[Message], tokenizer: Any = None, *, chat_template: bool | None = None) -> str:
    """The prompt text for `messages`, ending where the assistant's reply starts.

    chat_template: None uses the tokenizer's chat template when it has one, else the plain template;
    True requires it (ValueError when the tokenizer has none); False always uses the plain template.
    """
    if chat_template is None:
        chat_template = has_chat_template(tokenizer)
    elif chat_template and not has_chat_template(tokenizer):
        name = type(tokenizer).__name__ if tokenizer is not None else "None"
        raise ValueError(
            f"a chat template was requested but the tokenizer ({name}) has none; pass a tokenizer with a "
            "`chat_template`, or chat_template=False for the plain-text prompt"
        )
    if chat_template:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    user = "\n\n".join(m["content"] for m in messages if m["role"] != "system")
    return PLAIN_TEMPLATE.format(system=system, user=user).lstrip()


def render_prompt(
    example: Example,
    task: Task | None = None,
    tokenizer: Any = None,
    *,
    chat_template: bool | None = None,
    answer_format: str | None = None,
    system_prompt: str | None = SYSTEM_PROMPT,
) -> str:
    """`render_messages(build_messages(example, task, ...), tokenizer, chat_template=...)`."""
    messages = build_messages(example, task, answer_format=answer_format, system_prompt=system_prompt)
    return render_messages(messages, tokenizer, chat_template=chat_template)
