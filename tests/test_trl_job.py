"""A TRL GRPO job runs as it is through `kljax.RLTrainer` (issue 47): GRPOConfig in, TrainerCallbacks
called with a real TrainerState and honoured TrainerControl, TRL's metric names out, config.json as
TRL runs it; the translation's defaults are the installed TRL's."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import jax
import pytest

import kljax
from kljax.api import trl_args
from kljax.errors import UserError
from kljax.train.metrics import read_jsonl

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(6) for b in range(4)]
STATES: list = []


def correct(completions, solution, trainer_state, **kwargs):
    STATES.append((trainer_state, trainer_state.global_step, trainer_state.max_steps))
    return [1.0 if c.strip().startswith(s) else 0.0 for c, s in zip(completions, solution, strict=True)]


class Recorder(transformers.TrainerCallback):
    def __init__(self, stop_at: int | None = None):
        self.events: list[tuple[str, int]] = []
        self.logs: list[dict] = []
        self.stop_at = stop_at
        self.state = None

    def on_init_end(self, args, state, control, **kw):
        self.events.append(("init_end", state.global_step))

    def on_train_begin(self, args, state, control, **kw):
        self.events.append(("train_begin", state.global_step))
        self.state = state

    def on_step_end(self, args, state, control, **kw):
        self.events.append(("step_end", state.global_step))
        if self.stop_at is not None and state.global_step >= self.stop_at:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kw):
        self.logs.append(dict(logs))

    def on_save(self, args, state, control, **kw):
        self.events.append(("save", state.global_step))

    def on_train_end(self, args, state, control, **kw):
        self.events.append(("train_end", state.global_step))


def grpo_args(out, **changes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trl.GRPOConfig(output_dir=str(out), num_generations=4, max_completion_length=8,
                              per_device_train_batch_size=8, max_steps=2, beta=0.04, loss_type="dapo",
                              use_cpu=True, bf16=False, report_to="none", **changes)


def test_a_trl_grpo_job_runs_with_only_its_trainer_class_changed(tmp_path, capsys):
    STATES.clear()
    recorder = Recorder()
    args = grpo_args(tmp_path / "out", logging_steps=1, learning_rate=1e-3)
    trainer = kljax.RLTrainer(model="tiny", reward_funcs=[correct], args=args,
                              train_dataset=datasets.Dataset.from_list(ROWS), callbacks=[recorder], progress=False)
    assert recorder.events == [("init_end", 0)]
    trainer.train()
    out = capsys.readouterr().out
    assert "TRL GRPO config" in out and "beta" in out and "logging_steps=1" in out  # the translation, said
    steps = [s for e, s in recorder.events if e == "step_end"]
    assert steps == [1, 2] and recorder.events[-1] == ("train_end", 2)
    assert isinstance(recorder.state, transformers.TrainerState) and recorder.state.max_steps == 2
    assert len(recorder.logs) == 2 and all("reward" in log for log in recorder.logs)
    assert [h["step"] for h in recorder.state.log_history] == [1, 2]
    # the reward functions' trainer_state is the callbacks' TrainerState, with max_steps set from the start
    assert all(s is recorder.state for s, _, _ in STATES)
    assert {m for _, _, m in STATES} == {2} and {g for _, g, _ in STATES} == {0, 1, 2}
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")  # output_dir is the workdir
    for name in ("reward", "reward_std", "rewards/correct/mean", "completions/mean_length", "kl"):
        assert all(isinstance(r.get(name), float) and math.isfinite(r[name]) for r in rows), name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["rl"]["group_size"] == 4 and config["rl"]["max_new_tokens"] == 8
    assert config["rl"]["prompts_per_step"] == 8 * jax.device_count() // 4 and config["steps"] == 2
    assert config["kl"]["beta"] == 0.04 and (config["kl"]["estimator"], config["kl"]["placement"]) == ("k3", "loss")
    assert config["rl"]["loss_aggregation"] == "token-mean" and config["optim"]["learning_rate"] == 1e-3
    assert config["optim"]["schedule"] == "linear" and config["rl"]["temperature"] == 1.0  # TRL's, not kljax's


def test_a_callback_stops_the_run(tmp_path):
    recorder = Recorder(stop_at=1)
    trainer = kljax.RLTrainer(model="tiny", reward_funcs=[correct], args=grpo_args(tmp_path / "out"),
                              train_dataset=ROWS, callbacks=[recorder], progress=False)
    result = trainer.train()
    assert result.stopped_at == 1 and ("save", 1) in recorder.events
    assert [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [1]


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_the_translations_defaults_are_the_installed_trls(kind, tmp_path):
    cls = trl.GRPOConfig if kind == "grpo" else trl.RLOOConfig
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for key, value in trl_args.DEFAULTS[kind].items():
        got = defaults[key]
        got = getattr(got, "value", got)
        assert got == value or (value == "none" and got in ("none", None, [])), (key, got, value)
    assert f"TRL {trl.__version__}" == trl_args.TRL_VERSION


def test_trl_settings_map_exactly_or_are_named(tmp_path):
    t = trl_args.translate_trl(grpo_args(tmp_path, scale_rewards="batch", gradient_accumulation_steps=2,
                                         warmup_steps=0.5, lr_scheduler_type="cosine", top_k=5, min_p=0.1,
                                         repetition_penalty=1.2, mask_truncated_completions=True,
                                         generation_kwargs={"temperature": 0.7, "typical_p": 0.9},
                                         entropy_coef=0.1, save_total_limit=1, eval_strategy="steps", eval_steps=1))
    f = t.fields
    assert f["rl.advantage_scale"] == "batch" and f["rl.advantage"] == "grpo"
    assert f["rl.prompts_per_step"] == 4 and f["rl.micro_batches"] == 2  # 8 x 2 completions, groups of 4
    assert f["optim.warmup_steps"] == 1 and f["optim.schedule"] == "cosine"
    assert (f["rl.top_k"], f["rl.min_p"], f["rl.repetition_penalty"], f["rl.temperature"]) == (5, 0.1, 1.2, 0.7)
    assert f["rl.mask_truncated"] is True and f["keep_checkpoints"] == 1 and f["eval_every"] == 1
    assert any("typical_p" in a for a in t.approximate) and any("entropy_coef" in a for a in t.approximate)
    assert "scale_rewards" in t.exact and "warmup_steps" in t.exact
    with_vllm = trl_args.translate_trl({"use_vllm": True, "beta": 0.0, "max_steps": 3})
    assert any(n.startswith("use_vllm=True") for n in with_vllm.no_effect)
    epochs = trl_args.translate_trl({"num_generations": 4, "per_device_train_batch_size": 8}, rows=10)
    assert epochs.fields["steps"] == math.ceil(3.0 * 10 / 2)  # TRL's 3 epochs over 10 rows, 2 prompts a step
    with pytest.raises(UserError, match="num_generations=3"):
        trl_args.translate_trl({"num_generations": 3, "per_device_train_batch_size": 8})


def test_peft_config_maps_to_adapters():
    peft = pytest.importorskip("peft")
    fields, notes = trl_args.lora_fields(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                         use_rslora=True, lora_dropout=0.05))
    assert fields == {"model.lora.rank": 4, "model.lora.alpha": 16.0, "model.lora.targets": "q,v"}
    assert notes and "lora_dropout" in notes[0]
    everything, _ = trl_args.lora_fields(peft.LoraConfig(r=8, target_modules="all-linear"))
    assert everything["model.lora.targets"] == "q,k,v,o,gate,up,down"
    with pytest.raises(UserError, match="lm_head"):
        trl_args.lora_fields(peft.LoraConfig(r=8, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(UserError, match="bias"):
        trl_args.lora_fields(peft.LoraConfig(r=8, target_modules=["q_proj"], bias="all"))


def test_processing_class_sets_the_chat_template(tmp_path):
    from kljax.config.sections import ModelSection
    from kljax.models import transformer as tfm
    from kljax.models.config import ModelConfig
    from kljax.models.tokenizers import CharTokenizer
    from kljax.train.policy import model_and_tokenizer
    from kljax.train.sft import export_char_model

    alphabet = "0123456789+=<>abcdefghijklmnopqrstuvwxyz"
    config = ModelConfig(architecture="LlamaForCausalLM", vocab_size=CharTokenizer(alphabet).vocab_size,
                         hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                         max_position_embeddings=64, tie_embeddings=False, eos_token_ids=(1,), pad_token_id=0)
    hf = tmp_path / "hf"
    export_char_model(tfm.init_params(config, jax.random.PRNGKey(0)), config, hf, alphabet)
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
    assert tokenizer.chat_template != template
    tokenizer.chat_template = template
    trainer = kljax.RLTrainer(model=str(hf), processing_class=tokenizer, train_dataset=ROWS,
                              reward_funcs=[correct], workdir=tmp_path / "run")
    assert trainer.config.model.chat_template == template
    _, loaded = model_and_tokenizer(trainer.config.model)
    assert loaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                      add_generation_prompt=True) == "<user>hi<assistant>"
    assert transformers.AutoTokenizer.from_pretrained(hf).chat_template != template  # the model's files untouched
    with pytest.raises(UserError, match="chat_template"):
        ModelSection(source="tiny", chat_template=template)


def test_a_recorded_reward_that_cannot_be_imported_is_refused_at_start(tmp_path):
    spec = "trl.rewards.accuracy_rewards:cosine_scaled_reward"  # what a factory's function is recorded as
    with pytest.raises(UserError, match=r"reward_funcs=\[the object\]"):
        kljax.RLTrainer(model="tiny", config={"reward": {"functions": [spec]}}, workdir=tmp_path / "run")
    with pytest.raises(UserError, match="args=.*or config=, not both"):
        kljax.RLTrainer(model="tiny", args=grpo_args(tmp_path), config={"steps": 1})
    with pytest.raises(UserError, match="optimizers"):
        kljax.RLTrainer(model="tiny", optimizers=(object(), None))
