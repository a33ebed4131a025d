"""Selective prefill offload (Prefill-as-a-Service): long prompts prefilled in the cluster without
decoders, their KV over the WAN; short ones beside the decoders."""
import pytest

from pddsim.config import bundled, load_config
from pddsim.errors import InputError
from pddsim.sim import simulate

KV = 327_680


def offload(make_config, **kw):
    return make_config(roles=(("prefill", 1), ("prefill", 1), ("decode", 1)), two_clusters=True,
                       clusters__b__instances=[{"role": "prefill", "count": 1, "tp": 8},
                                               {"role": "decode", "count": 1, "tp": 8}],
                       policies={"offload_above_tokens": 4000}, **kw)


def test_long_prompts_are_prefilled_remotely_and_short_ones_locally(make_config, make_workload):
    res = simulate(offload(make_config), make_workload((0.0, 8192, 10), (0.5, 2048, 10),
                                                       (1.0, 4000, 10), (1.5, 4001, 10)))
    df = res.requests
    assert list(df.wan_bytes > 0) == [True, False, False, True]
    assert df.wan_bytes.iloc[0] == pytest.approx(8192 * KV)
    assert df.rdma_bytes.iloc[1] == pytest.approx(2048 * KV)


def test_offload_needs_prefill_on_both_sides(make_config):
    with pytest.raises((InputError, ValueError), match="offload_above_tokens"):
        make_config(roles=(("prefill", 1), ("decode", 1)), policies={"offload_above_tokens": 10})


def test_the_bundled_prfaas_configs_differ_only_by_the_remote_prefill():
    """The comparison's premise: PrfaaS is the baseline plus remote prefill and the line."""
    base = load_config(bundled("prfaas/homogeneous_pd.yaml"))
    ours = load_config(bundled("prfaas/prfaas.yaml"))
    assert ours.clusters["local"] == base.clusters["local"]
    assert ours.workload == base.workload and ours.slo == base.slo and ours.perf == base.perf
    assert [g.role for g in ours.clusters["remote"].instances] == ["prefill"]
