"""The Megatron-core training engine (MegatronEngine) and its helpers; importing this package imports no megatron."""
