"""The named attention example runs on 8 simulated devices and on one."""

import quax.testing


def test_named_attention_example_on_8_devices():
    out = quax.testing.run_on_simulated_devices(
        """
        import runpy
        result = runpy.run_path("examples/named_attention.py")["main"]()
        assert result["devices"] == "4 x 2", result
        assert float(result["max |sharded - positional|"]) < 1e-4, result
        assert result["w1 partition spec"] == "(None, 'model')", result
        assert result["heads"] == "NamedArray(float32[batch=8, heads=4, seq=16, dim=8])"
        assert result["running sum axes"] == "seq batch embed", result
        assert float(result["max |scan total - sum|"]) < 1e-4, result
        print("ok")
        """,
        n=8,
        timeout=300,
    )
    assert out.strip().endswith("ok")
