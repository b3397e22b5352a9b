"""Prompt data: row checks (rows.py), RLDataset and collate (dataset.py), the resumable PromptLoader (loader.py),
the embedded default's synthetic tasks (synthetic.py) and helpers for preprocessing scripts (preprocess.py).

Kept free of imports: reward worker processes import verl_like.data.synthetic and must not pay for torch.
"""
