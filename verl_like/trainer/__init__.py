"""The driver side: the PPO trainer loop, its metrics and checkpoints."""
