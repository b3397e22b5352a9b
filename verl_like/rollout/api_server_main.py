"""The vLLM OpenAI server as `verl_like.serve` starts it: `python -m verl_like.rollout.api_server_main ARGS`.

vLLM's `vllm.entrypoints.openai.api_server`, run as `__main__` in this process after one change on CPU: a one-rank
engine core runs its worker inside itself (vllm_compat.keep_cpu_one_rank_in_process; a CPU server starts ~9 s
sooner and generates faster on a 2-core machine). Being the `__main__` that vLLM's spawned engine processes import
first, this module also spares them the API server's own modules (its body runs only as `__main__`)."""

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

if __name__ == "__main__":
    import runpy

    from verl_like.rollout.vllm_compat import keep_cpu_one_rank_in_process

    keep_cpu_one_rank_in_process()
    runpy.run_module(API_SERVER_MODULE, run_name="__main__", alter_sys=False)
