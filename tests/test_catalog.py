import pytest

from pddsim import catalog
from pddsim.errors import InputError

REQUIRED_GPUS = {"h100-sxm", "h200", "h800", "h20", "a100-80gb", "l40s", "b200", "mi300x",
                 "ascend-910b"}
REQUIRED_MODELS = {"llama-3.1-70b", "qwen3-235b-a22b", "deepseek-v3", "pdd-1t-moe"}


def test_required_entries_exist_and_names_come_from_keys():
    gpus, models = catalog.gpus(), catalog.models()
    assert REQUIRED_GPUS <= set(gpus)
    assert REQUIRED_MODELS <= set(models)
    assert all(spec.name == key for key, spec in gpus.items())
    assert all(spec.name == key for key, spec in models.items())


def test_every_gpu_fp8_at_least_bf16():
    for spec in catalog.gpus().values():
        assert spec.fp8_tflops >= spec.bf16_tflops, spec.name


def test_gpu_spot_values():
    h100, h800, h20 = catalog.gpu("h100-sxm"), catalog.gpu("h800"), catalog.gpu("h20")
    assert h100.bf16_tflops == pytest.approx(989.4)
    assert h100.interconnect_gbps == 450               # NVLink 4: 900 both ways
    # H800 = H100 compute and memory with NVLink cut to 400 GB/s.
    assert h800.bf16_tflops == h100.bf16_tflops and h800.hbm_tbps == h100.hbm_tbps
    assert h800.interconnect_gbps == 200
    assert (h20.bf16_tflops, h20.hbm_gb, h20.hbm_tbps) == (148, 96, 4.0)
    # No FP8 on these: fp8 falls back to the 16-bit rate.
    for name in ("a100-80gb", "ascend-910b"):
        g = catalog.gpu(name)
        assert g.fp8_tflops == g.bf16_tflops


def test_model_hand_computed_values():
    llama = catalog.model("llama-3.1-70b")
    assert llama.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert llama.prefill_attn_flops == llama.decode_attn_flops == 4 * 64 * 128 * 80
    assert llama.shared_weight_bytes == llama.weight_bytes and llama.routed_pick_share == 0
    assert llama.weight_bytes == pytest.approx(70.6e9 * 2, rel=0.01)

    qwen = catalog.model("qwen3-235b-a22b")
    assert qwen.kv_bytes_per_token == 2 * 94 * 4 * 128 * 2

    dsv3 = catalog.model("deepseek-v3")
    assert dsv3.kv_bytes_per_token == 61 * (512 + 64) * 2
    assert dsv3.decode_attn_flops == 61 * (2 * 128 * (512 + 64) + 2 * 128 * 512)
    assert dsv3.prefill_attn_flops == 61 * (2 * 128 * (128 + 64) + 2 * 128 * 128)
    assert dsv3.weight_dtype == "fp8" and catalog.gpu("h100-sxm").peak_tflops("fp8") == 1978.9
    assert dsv3.weight_bytes == pytest.approx(671e9)

    pdd = catalog.model("pdd-1t-moe")
    assert pdd.kv_bytes_per_token == 46080
    assert pdd.decode_attn_flops == 61 * (2 * 64 * (512 + 64) + 2 * 64 * 512)
    assert pdd.prefill_attn_flops == 61 * (2 * 64 * (128 + 64) + 2 * 64 * 128)
    assert pdd.weight_dtype == "int4"        # W4A16: multiplied at the 16-bit peak
    assert catalog.gpu("h800").peak_tflops("int4") == catalog.gpu("h800").bf16_tflops
    assert pdd.weight_bytes == 1040e9 * 0.5            # INT4: fits one 8 x 80 GB node
    assert pdd.active_params_b < pdd.params_b


def test_unknown_names_raise_input_error():
    with pytest.raises(InputError):
        catalog.gpu("nope")
    with pytest.raises(InputError):
        catalog.model("nope")
