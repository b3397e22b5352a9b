"""The request bodies of vLLM's CUDA-IPC weight-transfer engine per release (rollout/vllm_compat.py), checked against
the shapes read in 0.25.1's source and against the installed release's own dataclasses (no GPU needed)."""

from __future__ import annotations

import base64
import pickle

import pytest

from verl_like.rollout.vllm_compat import ipc_init_info, ipc_update_info, pickle_ipc_handles

UUID = "GPU-0a1b2c3d"
BUCKET = dict(names=["model.embed_tokens.weight", "lm_head.weight"], dtype_names=["bfloat16", "bfloat16"],
              shapes=[[8, 4], [8, 4]], tensor_sizes=[64, 64])


def _update(version: str) -> dict:
    return ipc_update_info(version, **BUCKET, handles_pickled=pickle_ipc_handles({UUID: ("args", 0)}))


def test_vllm_0_25_takes_packed_in_every_update_and_nothing_at_init():
    assert ipc_init_info("0.25.1") == {}
    update = _update("0.25.1")
    assert update["packed"] is True and update["tensor_sizes"] == [64, 64]
    assert set(update) == {"names", "dtype_names", "shapes", "tensor_sizes", "ipc_handles_pickled", "packed"}


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.1"])
def test_later_vllm_takes_packed_once_at_init_and_rejects_it_per_update(version):
    assert ipc_init_info(version) == {"packed": True}
    assert "packed" not in _update(version)


def test_the_handles_travel_as_base64_of_their_pickle():
    text = _update("0.32.0")["ipc_handles_pickled"]
    assert pickle.loads(base64.b64decode(text)) == {UUID: ("args", 0)}


def test_a_malformed_version_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="not a vLLM version"):
        ipc_init_info("dev")


def test_the_installed_vllm_parses_what_we_send(monkeypatch):
    ipc_engine = pytest.importorskip("vllm.distributed.weight_transfer.ipc_engine")
    import vllm

    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # what verl_like.serve sets for ipc servers
    ipc_engine.IPCWeightTransferInitInfo(**ipc_init_info(vllm.__version__))
    update = ipc_engine.IPCWeightTransferUpdateInfo(**_update(vllm.__version__))
    assert update.ipc_handles == {UUID: ("args", 0)} and update.names == BUCKET["names"]
