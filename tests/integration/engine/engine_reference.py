"""Float64 single-process references for the engine tests: plain loops over unpadded sequences, no engine code.

Also the batch builder and loss functions both sides share (the loss functions follow the engine's loss
contract: each micro-batch returns its share of the global loss).
"""

from __future__ import annotations

import torch

PROMPT_LEN = 6
RESPONSE_LEN = 5
TEMPERATURE = 0.7


def make_batch(rows: int, vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded responses of random lengths, plus advantages / returns / targets."""
    generator = torch.Generator().manual_seed(seed)
    seq_len = PROMPT_LEN + RESPONSE_LEN
    input_ids = torch.randint(3, vocab_size, (rows, seq_len), generator=generator)
    attention_mask = torch.ones(rows, seq_len, dtype=torch.long)
    for row in range(rows):
        prompt_valid = int(torch.randint(1, PROMPT_LEN + 1, (1,), generator=generator))
        response_valid = int(torch.randint(1, RESPONSE_LEN + 1, (1,), generator=generator))
        attention_mask[row, : PROMPT_LEN - prompt_valid] = 0
        attention_mask[row, PROMPT_LEN + response_valid :] = 0
    input_ids = input_ids * attention_mask  # pad id 0
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": torch.clamp(attention_mask.cumsum(dim=1) - 1, min=0),
        "responses": input_ids[:, PROMPT_LEN:],
        "response_mask": attention_mask[:, PROMPT_LEN:],
        "advantages": torch.randn(rows, RESPONSE_LEN, generator=generator),
        "returns": torch.randn(rows, RESPONSE_LEN, generator=generator),
        "targets": torch.randn(rows, generator=generator),
    }


def policy_loss(outputs, micro_batch):
    """-sum(advantage * log_prob) over valid response tokens / global valid token count."""
    mask = micro_batch.batch["response_mask"].float()
    per_token = -outputs["log_probs"] * micro_batch.batch["advantages"]
    loss = (per_token * mask).sum() / micro_batch.meta_info["global_token_count"]
    return loss, {"tokens": float(mask.sum())}


def value_loss(outputs, micro_batch):
    """0.5 * sum((value - return)^2) over valid response tokens / global valid token count."""
    mask = micro_batch.batch["response_mask"].float()
    error = (outputs["values"] - micro_batch.batch["returns"]) ** 2
    return 0.5 * (error * mask).sum() / micro_batch.meta_info["global_token_count"], {}


def score_loss(outputs, micro_batch):
    """sum((score - target)^2) / global sequence count."""
    error = (outputs["scores"] - micro_batch.batch["targets"]) ** 2
    return error.sum() / micro_batch.meta_info["global_sequence_count"], {}


def _sequences(batch: dict[str, torch.Tensor]):
    """Per row: the valid token ids and the number of valid prompt tokens."""
    for row in range(batch["input_ids"].shape[0]):
        valid = batch["attention_mask"][row].bool()
        prompt_valid = int(valid[:PROMPT_LEN].sum())
        yield row, batch["input_ids"][row][valid], prompt_valid


def reference_outputs(model, kind: str, batch: dict[str, torch.Tensor], temperature: float = TEMPERATURE):
    """Outputs of a float64 HF model, one unpadded sequence at a time, as differentiable tensors."""
    rows = batch["input_ids"].shape[0]
    log_probs = [[torch.zeros((), dtype=torch.float64)] * RESPONSE_LEN for _ in range(rows)]
    entropy = [[torch.zeros((), dtype=torch.float64)] * RESPONSE_LEN for _ in range(rows)]
    values = [[torch.zeros((), dtype=torch.float64)] * RESPONSE_LEN for _ in range(rows)]
    scores = []
    for row, ids, prompt_valid in _sequences(batch):
        response_valid = len(ids) - prompt_valid
        if kind == "causal_lm":
            logits = model(input_ids=ids[None]).logits[0] / temperature
            for t in range(response_valid):
                position = prompt_valid - 1 + t
                log_softmax = torch.log_softmax(logits[position], dim=-1)
                log_probs[row][t] = log_softmax[ids[position + 1]]
                entropy[row][t] = -(log_softmax.exp() * log_softmax).sum()
        else:
            hidden = model.model(input_ids=ids[None]).last_hidden_state[0]
            per_token = model.score(hidden)[:, 0]
            if kind == "value":
                for t in range(response_valid):
                    values[row][t] = per_token[prompt_valid - 1 + t]
            else:
                scores.append(per_token[len(ids) - 1])
    if kind == "causal_lm":
        return {
            "log_probs": torch.stack([torch.stack(r) for r in log_probs]),
            "entropy": torch.stack([torch.stack(r) for r in entropy]),
        }
    if kind == "value":
        return {"values": torch.stack([torch.stack(r) for r in values])}
    return {"scores": torch.stack(scores)}


def reference_loss(kind: str, outputs, batch) -> torch.Tensor:
    """The global loss written as a plain sum over rows and tokens."""
    mask = batch["response_mask"].double()
    total = torch.zeros((), dtype=torch.float64)
    if kind == "sequence_classifier":
        for row in range(len(batch["targets"])):
            total = total + (outputs["scores"][row] - batch["targets"][row].double()) ** 2
        return total / len(batch["targets"])
    for row in range(mask.shape[0]):
        for t in range(RESPONSE_LEN):
            if mask[row, t]:
                if kind == "causal_lm":
                    total = total - outputs["log_probs"][row, t] * batch["advantages"][row, t].double()
                else:
                    total = total + 0.5 * (outputs["values"][row, t] - batch["returns"][row, t].double()) ** 2
    return total / mask.sum()


def reference_step(
    model, kind: str, batch, lr: float, eps: float, grad_clip: float | None, weight_decay: float = 0.0
):
    """One full-batch float64 step: (loss, pre-clip grad norm, {name: updated weight}) with torch's AdamW."""
    model.zero_grad(set_to_none=True)
    loss = reference_loss(kind, reference_outputs(model, kind, batch), batch)
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.sqrt(sum((p.grad**2).sum() for p in params))
    if grad_clip is not None:
        coefficient = min(1.0, grad_clip / (float(grad_norm) + 1e-6))
        for p in params:
            p.grad.mul_(coefficient)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=eps, weight_decay=weight_decay)
    optimizer.step()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    return float(loss.detach()), float(grad_norm), weights
