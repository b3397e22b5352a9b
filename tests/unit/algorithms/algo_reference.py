"""Independent float64 references for verl_like.algorithms, written as plain Python loops over samples and tokens.

Nothing here imports verl_like: each formula is re-derived from its paper so the vectorised code is checked
against a second, separate implementation. Inputs are nested lists (``tensor.tolist()``).
"""

from __future__ import annotations

import math

import torch

WHITEN_EPS = 1e-8


def devices() -> list[str]:
    """Devices to run the tests on: the CPU, and CUDA where present."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-9, atol: float = 1e-9) -> None:
    """torch.allclose with the worst difference in the message (torch.testing.assert_close imports
    torch.distributed.tensor on first use: ~3 s on 2 cores)."""
    expected = expected.to(device=actual.device, dtype=actual.dtype)
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if not torch.allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=False):
        diff = (actual - expected).abs().nan_to_num(float("inf"))
        where = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        raise AssertionError(f"tensors differ: max abs diff {diff.max().item():.3e} at index {where}")


def random_mask(batch: int, length: int, gen: torch.Generator, empty_rows: int = 1, holes: bool = True) -> torch.Tensor:
    """Right-padded response masks with random lengths, optional holes (multi-turn), and `empty_rows` empty rows."""
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for i in range(batch):
        n = int(torch.randint(1, length + 1, (1,), generator=gen))
        mask[i, :n] = True
        if holes and n > 3 and bool(torch.rand(1, generator=gen) < 0.5):
            start = int(torch.randint(1, n - 1, (1,), generator=gen))
            mask[i, start : start + 2] = False
    for i in range(min(empty_rows, batch)):
        mask[batch - 1 - i] = False
    return mask


def valid_positions(mask_row: list) -> list[int]:
    return [t for t, m in enumerate(mask_row) if m]


def whiten(values: list[list[float]], mask: list[list[bool]]) -> list[list[float]]:
    flat = [values[i][t] for i in range(len(values)) for t in range(len(values[i])) if mask[i][t]]
    n = len(flat)
    mean = sum(flat) / n if n else 0.0
    var = sum((x - mean) ** 2 for x in flat) / (n - 1) if n > 1 else 0.0
    scale = 1.0 / math.sqrt(var + WHITEN_EPS)
    out = [[0.0] * len(row) for row in values]
    for i in range(len(values)):
        for t in range(len(values[i])):
            if mask[i][t]:
                out[i][t] = (values[i][t] - mean) * scale
    return out


def gae(rewards, values, mask, gamma, lam):
    adv = [[0.0] * len(r) for r in rewards]
    ret = [[0.0] * len(r) for r in rewards]
    for i in range(len(rewards)):
        pos = valid_positions(mask[i])
        running = 0.0
        for k in reversed(range(len(pos))):
            t = pos[k]
            next_value = values[i][pos[k + 1]] if k + 1 < len(pos) else 0.0
            delta = rewards[i][t] + gamma * next_value - values[i][t]
            running = delta + gamma * lam * running
            adv[i][t] = running
            ret[i][t] = running + values[i][t]
    return whiten(adv, mask), ret


def discounted_returns(rewards, mask, gamma):
    out = [[0.0] * len(r) for r in rewards]
    for i in range(len(rewards)):
        running = 0.0
        for t in reversed(valid_positions(mask[i])):
            running = rewards[i][t] + gamma * running
            out[i][t] = running
    return out


def _scores(rewards, mask):
    return [sum(rewards[i][t] for t in valid_positions(mask[i])) for i in range(len(rewards))]


def _groups(index):
    groups: dict = {}
    for i, uid in enumerate(index):
        groups.setdefault(uid, []).append(i)
    return groups


def _broadcast(per_seq, mask):
    return [[per_seq[i] if mask[i][t] else 0.0 for t in range(len(mask[i]))] for i in range(len(mask))]


def grpo(rewards, mask, index, norm_by_std, eps):
    scores = _scores(rewards, mask)
    per_seq = [0.0] * len(scores)
    for members in _groups(index).values():
        vals = [scores[j] for j in members]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
        for j in members:
            per_seq[j] = (scores[j] - mean) / (std + eps) if norm_by_std else scores[j] - mean
    return _broadcast(per_seq, mask)


def rloo(rewards, mask, index):
    scores = _scores(rewards, mask)
    per_seq = [0.0] * len(scores)
    for members in _groups(index).values():
        for j in members:
            others = [scores[k] for k in members if k != j]
            per_seq[j] = scores[j] - sum(others) / len(others) if others else 0.0
    return _broadcast(per_seq, mask)


def reinforce_pp_baseline(rewards, mask, index):
    scores = _scores(rewards, mask)
    per_seq = [0.0] * len(scores)
    for members in _groups(index).values():
        mean = sum(scores[j] for j in members) / len(members)
        for j in members:
            per_seq[j] = scores[j] - mean
    return whiten(_broadcast(per_seq, mask), mask)


def remax(rewards, mask, baselines):
    returns = discounted_returns(rewards, mask, 1.0)
    adv = [[returns[i][t] - baselines[i] if mask[i][t] else 0.0 for t in range(len(mask[i]))] for i in range(len(mask))]
    return adv, returns


def aggregate(loss, mask, mode, scale_factor):
    """Full-batch aggregation (no normaliser object: the formula straight from the definitions)."""
    rows = [valid_positions(m) for m in mask]
    seqs = [i for i, p in enumerate(rows) if p]
    if mode == "token-mean":
        n = sum(len(p) for p in rows)
        return sum(loss[i][t] for i, p in enumerate(rows) for t in p) / n if n else 0.0
    if not seqs:
        return 0.0
    if mode == "seq-mean-token-sum":
        return sum(sum(loss[i][t] for t in rows[i]) for i in seqs) / len(seqs)
    if mode == "seq-mean-token-mean":
        return sum(sum(loss[i][t] for t in rows[i]) / len(rows[i]) for i in seqs) / len(seqs)
    if mode == "seq-mean-token-sum-norm":
        return sum(sum(loss[i][t] for t in rows[i]) / scale_factor for i in seqs) / len(seqs)
    raise ValueError(mode)


def ppo_clip_token(lp, old, adv, low, high, c):
    log_ratio = max(-20.0, min(20.0, lp - old))
    ratio = math.exp(log_ratio)
    value = max(-adv * ratio, -adv * min(max(ratio, 1 - low), 1 + high))
    if c is not None and adv < 0:
        value = min(value, -adv * c)
    return value


def gspo_tokens(lp_row, old_row, adv_row, mask_row, low, high):
    pos = valid_positions(mask_row)
    out = [0.0] * len(mask_row)
    if not pos:
        return out
    s = math.exp(max(-20.0, min(20.0, sum(lp_row[t] - old_row[t] for t in pos) / len(pos))))
    for t in pos:
        a = adv_row[t]
        out[t] = max(-a * s, -a * min(max(s, 1 - low), 1 + high))
    return out


def is_weights(old, rollout, mask, level, mode, upper, lower):
    out = [[0.0] * len(m) for m in mask]
    for i in range(len(mask)):
        pos = valid_positions(mask[i])
        seq_sum = sum(old[i][t] - rollout[i][t] for t in pos)
        for t in pos:
            if level == "token":
                log_w = old[i][t] - rollout[i][t]
            elif level == "sequence":
                log_w = seq_sum
            else:
                log_w = seq_sum / len(pos)
            if mode == "truncate":
                out[i][t] = math.exp(min(log_w, math.log(upper)))
            else:
                out[i][t] = math.exp(log_w) if math.log(lower) <= log_w <= math.log(upper) else 0.0
    return out


def value_loss_token(vpred, value, ret, clip):
    unclipped = (vpred - ret) ** 2
    if clip is None:
        return 0.5 * unclipped
    vclip = value + min(max(vpred - value, -clip), clip)
    return 0.5 * max(unclipped, (vclip - ret) ** 2)


def entropy(logits_row: list[float]) -> float:
    finite = [x for x in logits_row if x != float("-inf")]
    top = max(finite)
    z = sum(math.exp(x - top) for x in finite)
    h = 0.0
    for x in finite:
        p = math.exp(x - top) / z
        if p > 0:
            h -= p * math.log(p)
    return h


def kl_token(lp, ref, kind):
    d = lp - ref
    if kind in ("k1", "kl", "k1+"):
        return d
    if kind == "abs":
        return abs(d)
    if kind in ("k2", "mse"):
        return 0.5 * d * d
    if kind in ("k3", "low_var_kl", "k3+"):
        neg = max(-20.0, min(20.0, -d))
        return min(math.exp(neg) - neg - 1.0, 10.0)
    raise ValueError(kind)


def adaptive_kl(value, target, horizon, kls, n_steps):
    for kl in kls:
        error = min(max(kl / target - 1.0, -0.2), 0.2)
        value = value * (1.0 + error * n_steps / horizon)
    return value


def overlong_penalty(length, max_len, buffer_len, factor):
    expected = max_len - buffer_len
    if length <= expected:
        return 0.0
    if length <= max_len:
        return (expected - length) / buffer_len * factor
    return -factor


def ppo_clip_token_grad(lp, old, adv, low, high, c):
    """d(per-token PPO loss)/d(log pi): -A r on the unclipped branch, 0 where a clip bound is active."""
    log_ratio = lp - old
    if abs(log_ratio) > 20.0:
        return 0.0  # the log-ratio clamp is active
    ratio = math.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * min(max(ratio, 1 - low), 1 + high)
    if c is not None and adv < 0 and max(unclipped, clipped) > -adv * c:
        return 0.0  # dual-clip constant
    if unclipped >= clipped:
        return -adv * ratio
    return 0.0
