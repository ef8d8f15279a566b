"""One decision for the device of a JAX array (issue 35 item 1a).

Eager ops (`lowering.eager`) and ``Tensor.from_dlpack`` / Tensor leaves
(`maxfx.experimental._tensor`) used to place a ``jax.Array`` on host device 3
differently (``cpu:3`` vs ``cpu:0``), so ``F.add(Tensor.from_dlpack(a3), a3)``
said the inputs were on different devices. Both now ask
`lowering.devices.array_device_ref`. The multi-device checks run in a child
process with 4 forced host devices (this file run as a script), as
tests/sharding/test_sharding.py does.
"""

import json
import sys

import numpy as np
import pytest

N_DEVICES = 4


def _child() -> dict:
    import jax

    from lowering.devices import array_device_ref
    from maxfx.experimental import functional as F
    from maxfx.experimental.tensor import Tensor

    a3 = jax.device_put(np.arange(4, dtype=np.float32), jax.devices()[3])
    t = Tensor.from_dlpack(a3)
    out = {"n_devices": len(jax.devices()), "leaf_device": str(t.type.device), "ref": str(array_device_ref(a3))}
    try:
        s = F.add(t, a3)
        out["sum"] = np.asarray(s.to_numpy()).tolist()
        out["sum_device"] = str(s.type.device)
    except Exception as e:  # noqa: BLE001 - reported to the parent test
        out["error"] = f"{type(e).__name__}: {e}"
    return out


if __name__ == "__main__":
    print(json.dumps(_child()))
    sys.exit(0)


@pytest.fixture(scope="module")
def child():
    from tests.forced_devices import run_with_forced_devices  # noqa: PLC0415 - this file also runs as the child script

    return run_with_forced_devices(__file__, N_DEVICES, timeout=300)


def test_tensor_leaf_and_eager_op_agree_on_array_device(child):
    assert child["n_devices"] == N_DEVICES
    assert child["ref"] == "cpu:3"
    assert child["leaf_device"] == "cpu:3"  # was cpu:0 in _tensor.py's copy


def test_add_tensor_and_array_on_same_host_device(child):
    assert "error" not in child, child.get("error")
    np.testing.assert_array_equal(child["sum"], np.arange(4, dtype=np.float32) * 2)
    assert child["sum_device"] == "cpu:3"


def test_one_function_decides():
    import lowering.eager as eager
    from lowering.devices import array_device_ref
    from maxfx.experimental import _tensor

    assert eager._device_ref is array_device_ref
    assert _tensor.array_device_ref is array_device_ref
    assert not hasattr(_tensor, "_array_device_ref")
