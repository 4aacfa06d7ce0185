"""`kljax generate --checkpoint WORKDIR`: greedy text from a run's checkpoint, prompted as the run was.

Each --prompt is the user message of the run's prompts: its system prompt (config.task.system_prompt),
answer-format line (config.task.answer_format, or a built-in task's own) and prompt format (chat
template, plain or raw), from WORKDIR/config.json; the data files of a file task are not needed.
"""

from __future__ import annotations

import argparse
from typing import Any

import ml_collections


def prompt_texts_for(config: ml_collections.ConfigDict, tokenizer: Any, prompts: list[str]) -> list[str]:
    """The text the run would have fed the model for each prompt (see the module docstring)."""
    from kljax.tasks.base import Example
    from kljax.tasks.files import FORMATS
    from kljax.tasks.prompting import ANSWER_FORMATS, render_messages
    from kljax.train.rollout import prompt_texts

    t = config.task
    fmt = str(t.prompt_format)
    if str(t.name) not in FORMATS:
        from kljax.tasks.from_config import task_from_config

        task = task_from_config(config)
        return prompt_texts([Example(p, "", task.name, "train", str(i)) for i, p in enumerate(prompts)], task,
                            tokenizer, fmt)
    if fmt == "raw":
        return list(prompts)
    system = t.get("system_prompt", None) or ""  # the user's data: a system prompt only when asked
    line = f"\n\n{ANSWER_FORMATS[t.answer_format]}" if t.get("answer_format") else ""
    if fmt == "auto" and not system:  # standard prompts as written (kljax.tasks.prompting)
        return [p.strip() + line if line else p for p in prompts]
    return [render_messages(([{"role": "system", "content": system}] if system else [])
                            + [{"role": "user", "content": p.strip() + line}], tokenizer,
                            chat_template={"chat": True, "plain": False}.get(fmt))
            for p in prompts]


def run_checkpoint(args: argparse.Namespace) -> int:
    """Print the greedy completion of each --prompt by WORKDIR's checkpoint (--step, default latest)."""
    from kljax.sampling import greedy_continuations
    from kljax.studies import evaluate as ev

    params, policy, config, step = ev.restore_params(args.checkpoint, args.step)
    texts = prompt_texts_for(config, policy.tokenizer, list(args.prompt))
    ids = []
    for i, text in enumerate(texts):
        toks = list(policy.tokenizer.encode(text, add_special_tokens=False))
        if not toks or len(toks) + args.max_new_tokens > policy.model.max_position_embeddings:
            raise ValueError(f"--prompt number {i + 1} has {len(toks)} tokens after the run's templating; it must "
                             f"have 1 to {policy.model.max_position_embeddings - args.max_new_tokens} with "
                             f"--max-new-tokens={args.max_new_tokens}")
        ids.append(toks)
    outputs = greedy_continuations(params, policy.model, ids, args.max_new_tokens, list(policy.stop_token_ids),
                              policy.pad_id)
    for i, out in enumerate(outputs):
        if len(outputs) > 1:
            print(f"--- {i}")
        print(policy.tokenizer.decode(list(out), skip_special_tokens=True))
    return 0
