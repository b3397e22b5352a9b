"""Training engines behind one interface (`base.TrainEngine`): `fsdp.FSDPEngine` (FSDP2), configured by `config.EngineConfig`."""
