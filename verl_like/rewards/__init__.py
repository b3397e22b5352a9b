"""Rewards: rule scorers (gsm8k.py, math.py, format.py, synthetic.py), the data_source registry (registry.py),
custom reward functions from files (custom.py), the scoring process pool (pool.py) and RewardManager (manager.py).

Kept free of imports: scoring worker processes import the scorers and must not pay for torch.
"""
