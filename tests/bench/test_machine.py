"""Every benchmark states its machine: the CPU, its vector ISA, and the kernels torch actually ran."""

from __future__ import annotations

from dflash_bench.machine import describe, isa_summary, one_line


def test_the_isa_levels_that_decide_bf16_speed():
    assert isa_summary(["avx2", "fma"]) == "AVX2, no AVX-512, no AMX"
    assert isa_summary(["avx2", "avx512f", "avx512_bf16"]) == "AVX2, AVX-512 with BF16, no AMX"
    assert isa_summary(["avx2", "avx512f", "amx_bf16"]) == "AVX2, AVX-512 without BF16, AMX-BF16"


def test_kernels_capped_by_the_environment_are_stated(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    plain = describe()
    assert "kernel_caps" not in plain and "capped" not in one_line(plain) and plain["torch_kernels"]
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # read at oneDNN's start: only the record says so here
    capped = describe()
    assert capped["kernel_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert f"capped by ONEDNN_MAX_CPU_ISA=AVX2 to {capped['torch_kernels']}" in one_line(capped)
