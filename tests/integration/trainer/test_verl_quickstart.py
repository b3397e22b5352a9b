"""verl's PPO quick-start command line, with only the module name changed and a short tail that shrinks it to 2
steps (as verl's scripts take extra `$@` overrides), trains with its critic, GAE and its epochs; its checkpoint
exports to HF with verl's model_merger command."""

from __future__ import annotations

import pandas as pd
from transformers import AutoModelForCausalLM

from verl_like.main_ppo import run
from verl_like.model_merger import main as model_merger
from verl_like.models.tiny import TinyModelSpec, build_tiny_model


def _gsm8k_like(path, rows: int) -> str:
    """verl's GSM8K parquet layout (examples/data_preprocess/gsm8k.py), in the tiny tokenizer's alphabet."""
    pd.DataFrame([{
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"what is {i} + {i + 1}? answer after ####."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i + 1)},
        "extra_info": {"split": "train", "index": i},
    } for i in range(rows)]).to_parquet(path)
    return str(path)


def test_verl_ppo_quickstart_runs_gae_with_its_critic_for_its_epochs(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the command saves under checkpoints/verl_examples/gsm8k, relative as in verl
    model = build_tiny_model(tmp_path / "qwen", TinyModelSpec(max_position_embeddings=1024))
    train, val = _gsm8k_like(tmp_path / "train.parquet", 4), _gsm8k_like(tmp_path / "test.parquet", 2)
    quickstart = [
        f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=256",
        "data.max_prompt_length=512", "data.max_response_length=256", f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.optim.lr=1e-5",
        f"critic.model.path={model}", "critic.ppo_micro_batch_size_per_gpu=4", "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=console", "trainer.val_before_train=False", "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1", "trainer.save_freq=10", "trainer.test_freq=10", "trainer.total_epochs=15",
    ]
    tail = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "data.max_prompt_length=48", "data.max_response_length=8", "trainer.total_epochs=2"]
    last = run([*quickstart, *tail])
    assert "critic/vf_loss" in last and "critic/values/mean" in last  # GAE with the configured critic
    assert "val/score/mean" in last  # test_freq: validation at the last step
    run_dir = tmp_path / "checkpoints" / "verl_examples" / "gsm8k" / "checkpoints"  # verl_like's run layout
    # 4 prompts, batch 4: one step per epoch, 2 epochs -> 2 steps (total_epochs honoured; checkpoint at the end).
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    step = run_dir / "global_step_2"
    assert (step / "critic").is_dir() and (step / "actor" / "huggingface" / "config.json").is_file()
    model_merger(["merge", "--backend", "fsdp", "--local_dir", str(step / "actor"), "--target_dir", str(tmp_path / "hf")])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert merged.config.max_position_embeddings == 1024


def test_verl_grpo_example_runs_grpo_with_its_group_size_and_kl_loss_for_its_epochs(ray_cluster, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = build_tiny_model(tmp_path / "qwen", TinyModelSpec(max_position_embeddings=2048))
    train, val = _gsm8k_like(tmp_path / "train.parquet", 4), _gsm8k_like(tmp_path / "test.parquet", 2)
    example = [  # examples/grpo_trainer/run_qwen2-7b.sh
        "algorithm.adv_estimator=grpo", f"data.train_files={train}", f"data.val_files={val}",
        "data.train_batch_size=1024", "data.max_prompt_length=512", "data.max_response_length=1024",
        "data.filter_overlong_prompts=True", "data.truncation='error'", f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0", 'trainer.logger=["console","wandb"]',
        "trainer.project_name=verl_grpo_example_gsm8k", "trainer.experiment_name=qwen2_7b_function_rm",
        "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
        "trainer.total_epochs=15",
    ]
    # The tail a CPU run needs: 2 workers, vLLM TP 1, no W&B account here, sizes for 4 prompts x 5 samples.
    tail = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "trainer.logger=console", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=5",
            "data.max_prompt_length=48", "data.max_response_length=8", "trainer.total_epochs=2"]
    last = run([*example, *tail])
    assert "critic/vf_loss" not in last and "actor/kl_loss" in last  # GRPO: no critic; the KL loss is on
    # (rollout.n=5 and the other keys as composed: tests/unit/config/test_verl_commands.py)
    run_dir = tmp_path / "checkpoints" / "verl_grpo_example_gsm8k" / "qwen2_7b_function_rm" / "checkpoints"
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"  # 2 epochs x 1 step
    assert not (run_dir / "global_step_2" / "critic").exists()
