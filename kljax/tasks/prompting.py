"""Prompts: chat messages for an example, rendered with a tokenizer's chat template or as plain text.

    messages = build_messages(example, task)          # [{"role": "system", ...}, {"role": "user", ...}]
    text = render_messages(messages, tokenizer)       # the chat template when the tokenizer has one
    texts = prompt_texts(examples, task, tokenizer, prompt_format)   # what the model is fed

The user message is the example's prompt, then the task's own instruction (if any), then the answer format:
"boxed" asks for the final answer in \\boxed{}, "answer_line" for a last line "Answer: ...", both what
`answers.extract_final_answer` reads first. Tokenizers are duck-typed (`has_chat_template`); without a chat
template `PLAIN_TEMPLATE` is used, unless the template was asked for explicitly (`chat_template=True`),
which is then an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kljax.tasks.base import Example, Task

SYSTEM_PROMPT = "You are a helpful assistant. Reason step by step, then state the final answer."
ANSWER_FORMATS = {
    "boxed": "Put your final answer within \\boxed{}.",
    "answer_line": 'End your response with a line of the form "Answer: <your final answer>".',
}
PLAIN_TEMPLATE = "{system}\n\nUser: {user}\n\nAssistant:"
PROMPT_FORMATS = ("auto", "chat", "plain", "raw")

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
    """Whether `tokenizer` has a usable chat template: anything with `apply_chat_template(messages,
    tokenize=False, add_generation_prompt=True)` and a non-empty `chat_template` attribute (Hugging Face
    tokenizers do; tests pass a tiny fake)."""
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


def prompt_texts(examples: Sequence[Example], task: Task, tokenizer: Any, prompt_format: str) -> list[str]:
    """The text each prompt is tokenized from, by `prompt_format` (task.prompt_format):
        auto   built-in tasks: the chat (with kljax's system prompt and answer-format line) through the chat
               template, or the plain template without one. Data files (TRL's layouts): a standard prompt as
               written; a conversational one through the chat template (without one: the messages' contents,
               one per line). A system prompt or answer-format line only when asked.
        chat   the conversation through the chat template (an error when the tokenizer has none)
        plain  the conversation in `PLAIN_TEMPLATE`
        raw    the prompt as written (conversational: the messages' contents, one per line)
    """
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"config.task.prompt_format={prompt_format!r} is not valid; choose one of "
                         f"{list(PROMPT_FORMATS)}")
    template = {"chat": True, "plain": False}.get(prompt_format)  # auto: the tokenizer's when it has one
    if hasattr(task, "messages"):  # the user's data (kljax.tasks.files.FileTask) builds its own conversation
        if getattr(task, "conversational", False):
            if prompt_format == "raw" or (prompt_format == "auto" and not has_chat_template(tokenizer)):
                return ["\n".join(m["content"] for m in task.messages(ex)) for ex in examples]
        elif prompt_format == "raw" or (prompt_format == "auto" and not task.system_prompt):
            return [task.as_written(ex) for ex in examples]
        return [render_messages(task.messages(ex), tokenizer, chat_template=template) for ex in examples]
    if prompt_format == "raw":
        return [ex.prompt for ex in examples]
    system = getattr(task, "system_prompt", SYSTEM_PROMPT)  # config.task.system_prompt, see tasks.from_config
    return [render_messages(build_messages(ex, task, system_prompt=system), tokenizer, chat_template=template)
            for ex in examples]
